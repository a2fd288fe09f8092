package p2p

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkLink measures one ring link: rank 0 sends 64 MiB in 1 MiB writes
// to rank 1.
func BenchmarkLink(b *testing.B) {
	cases := []struct {
		name, mode string
		hostID     func(int) string
	}{
		{"unix", DataPlaneAuto, nil},
		{"tls", DataPlaneTLS, nil},
		{"plaintext-tcp", DataPlanePlaintext, func(r int) string { return fmt.Sprintf("benchhost-%d", r) }},
	}
	const total, chunk = 64 << 20, 1 << 20
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			j := startJob(b, jobOpts{size: 2, mode: c.mode, hostID: c.hostID, timeout: 30 * time.Second})
			send, recv := j.nodes[0].Transport(), j.nodes[1].Transport()
			ctx := context.Background()
			src, dst := make([]byte, chunk), make([]byte, chunk)
			b.SetBytes(total)
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				wg.Add(1)
				var rerr error
				go func() {
					defer wg.Done()
					for range total / chunk {
						if rerr = recv.RecvPrev(ctx, dst); rerr != nil {
							return
						}
					}
				}()
				for range total / chunk {
					if err := send.SendNext(ctx, src); err != nil {
						b.Fatal(err)
					}
				}
				wg.Wait()
				if rerr != nil {
					b.Fatal(rerr)
				}
			}
			b.StopTimer()
		})
	}
}
