package collective

import (
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// The job key, which proves membership in the job: from GORUN_JOB_KEY, or
// from a file only its owner can read, as ssh demands of a private key.

// readJobKey reads the job key from GORUN_JOB_KEY, or from the file named
// by GORUN_JOB_KEY_FILE. Like ssh with a private key, it refuses a file
// that is not a regular file or that its group or others may read: the key
// is what proves membership in the job.
func readJobKey(getenv func(string) string) ([]byte, error) {
	text, from := getenv(EnvJobKey), EnvJobKey
	if text == "" && getenv(EnvJobKeyFile) != "" {
		name := getenv(EnvJobKeyFile)
		from = EnvJobKeyFile + "=" + name
		b, err := readPrivateFile(name)
		if err != nil {
			return nil, fmt.Errorf("job key from %s: %w", EnvJobKeyFile, err)
		}
		text = string(b)
	}
	text = strings.TrimSpace(text)
	if text == "" {
		return nil, nil
	}
	key, err := hex.DecodeString(text)
	if err != nil || len(key) < 16 {
		return nil, fmt.Errorf("job key from %s must be at least 32 hex digits (16 bytes)", from)
	}
	return key, nil
}

// readPrivateFile reads a regular file that only its owner may read or
// write (mode & 0o077 == 0). The mode is that of the file opened, so a
// symbolic link (a Kubernetes Secret volume's files are links) is judged
// by its target. It opens without blocking, so a FIFO named by mistake is
// refused rather than waited on forever.
func readPrivateFile(name string) ([]byte, error) {
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v): put the key in a file and run chmod 600 on it", name, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %04o, so others than its owner can read it: run chmod 600 %s (on Kubernetes: defaultMode: 0400 on the Secret volume, and no fsGroup)", name, perm, name)
	}
	return io.ReadAll(io.LimitReader(f, 1<<16))
}
