package p2p

// Shared-memory links (kind "shm") between ranks of one host.
//
// A unix socket costs two system calls and two copies per message and a
// wake-up of the receiving thread; for the small, latency-bound messages of
// a ring step that is most of the time a collective takes. An shm link
// moves the bytes of one directed link through a ring buffer that both
// processes map, and uses the link's unix socket only to set it up and to
// notice that the peer is gone.
//
// The link's end is link_shm.go; the mapping's layout and creation
// shm_ring.go; passing it to the peer shm_setup.go; waiting for the peer
// shm_wait.go. This file holds what configures them.

import (
	"fmt"
	"math/bits"
	"os"

	"github.com/gorun/gorun/ring"
)

const (
	envShm      = "GORUN_SHM"       // "0", "off", "false" or "no": ranks of one host use unix sockets
	envShmBytes = "GORUN_SHM_BYTES" // ring capacity of every shm link, rounded up to a power of two

	// defaultShmBytes: a smaller ring costs more CPU per byte moved (the
	// writer waits for space more often); a larger one gains nothing and
	// takes more of the cache (BenchmarkLink).
	defaultShmBytes = 2 << 20
	// minShmBytes: the ring's schedules send a message of up to
	// ring.SmallBytes before they receive (see ring.SmallBytes), so every
	// link must buffer that much plus a header, or two ranks that send
	// to each other first would both wait for space forever.
	minShmBytes = 2 * ring.SmallBytes
	maxShmBytes = 1 << 30

	// shmHostBytes bounds the rings a host's ranks write, all links
	// together, when GORUN_SHM_BYTES does not set their size
	// (shmRingBytes).
	shmHostBytes = 1 << 30

	// shmChunk bounds how much a writer copies before it publishes (and a
	// reader before it frees space), so the other side works in parallel
	// on a long message.
	shmChunk = 64 << 10
)

// shmEnabled says whether this process allows shm links: cfg.NoShm and
// GORUN_SHM=0 turn them off.
func shmEnabled(cfg Config) bool {
	if cfg.NoShm {
		return false
	}
	switch os.Getenv(envShm) {
	case "0", "off", "false", "no":
		return false
	}
	return true
}

// shmCapacity is the ring size this process creates: GORUN_SHM_BYTES
// (4096, 512K, 4M), rounded up to a power of two and clamped to
// [minShmBytes, maxShmBytes], or defaultShmBytes.
func shmCapacity() (int, error) {
	s := os.Getenv(envShmBytes)
	if s == "" {
		return defaultShmBytes, nil
	}
	v, err := ring.ParseBytes(s)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%s=%q: want the size of a shared-memory link's buffer, e.g. 2M", envShmBytes, s)
	}
	c := min(max(v, minShmBytes), maxShmBytes)
	return 1 << bits.Len(uint(c-1)), nil
}

// shmRingBytes is the ring capacity of the links of a host with local
// ranks, when GORUN_SHM_BYTES does not set it: defaultShmBytes, halved
// (down to minShmBytes) until the host's rings fit shmHostBytes. Every
// pair of the host's ranks has two links, local(local-1) rings, each
// allocated when it is set up (shm_ring.go): at 2 MiB, 128 ranks on one
// host would take 32 GiB, more than such a host may have, and allocating
// them took most of the setup. Up to 23 ranks keep 2 MiB; 64 get
// 256 KiB; from 65 on, minShmBytes, of which a host of 256 ranks needs
// 8 GiB.
func shmRingBytes(local int) int {
	c := defaultShmBytes
	for c > minShmBytes && local*(local-1)*c > shmHostBytes {
		c /= 2
	}
	return c
}

// Mapping layout. Every counter the two processes write has a cache line
// (two, against the adjacent-line prefetcher) of its own.
