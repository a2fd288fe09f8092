//go:build !amd64 || purego

package compress

// useAsm is false without the amd64 kernels: every codec runs its generic
// Go code. The stubs below only satisfy the compiler (calls to them are
// behind useAsm and removed as dead code).
const useAsm = false

func int8Enc64(dst *byte, src *float32, nblk int) int            { panic("compress: no kernels") }
func int8EncRes64(dst *byte, src, res *float32, nblk int) int    { panic("compress: no kernels") }
func int8Dec64(dst *float32, src *byte, nblk int) int            { panic("compress: no kernels") }
func int8DecAdd64(dst *float32, src *byte, nblk int) int         { panic("compress: no kernels") }
func f16Enc(dst *byte, src *float32, n int) int                  { panic("compress: no kernels") }
func f16EncRes(dst *byte, src, res *float32, n int) int          { panic("compress: no kernels") }
func f16Dec(dst *float32, src *byte, n int) int                  { panic("compress: no kernels") }
func f16DecAdd(dst *float32, src *byte, n int) int               { panic("compress: no kernels") }
func bf16Enc(dst *byte, src *float32, n int)                     { panic("compress: no kernels") }
func bf16EncRes(dst *byte, src, res *float32, n int)             { panic("compress: no kernels") }
func bf16Dec(dst *float32, src *byte, n int)                     { panic("compress: no kernels") }
func bf16DecAdd(dst *float32, src *byte, n int)                  { panic("compress: no kernels") }
func f32AddK(dst *float32, src *byte, n int)                     { panic("compress: no kernels") }
func int8EncAddRes64(dst *byte, src, res *float32, nblk int) int { panic("compress: no kernels") }
func f16EncAddRes(dst *byte, src, res *float32, n int) int       { panic("compress: no kernels") }
func bf16EncAddRes(dst *byte, src, res *float32, n int)          { panic("compress: no kernels") }
