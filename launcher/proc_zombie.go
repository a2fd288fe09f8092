package launcher

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"runtime"
	"strconv"
)

// exitedUnreaped says whether local process pid has ended and only waits
// to be reaped (a zombie): its exit, with its real cause (a kill -9, say),
// is on its way to gorun's loop, which must not end it as a straggler and
// report it "ended by gorun" first. Only Linux's /proc says; elsewhere
// false.
func exitedUnreaped(pid int) bool {
	if runtime.GOOS != "linux" || pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	// The state follows the command name's closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	switch b[i+2] {
	case 'Z', 'X', 'x':
		return true
	}
	return false
}
