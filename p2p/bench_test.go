package p2p

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLink measures one ring link: rank 0 sends 64 MiB to rank 1, over
// every kind of link in the same run. Shapes: "1MiB", plain 1 MiB writes;
// "hdr+256KiB", what the ring sends: a 56-byte header and a 256 KiB chunk
// per message, read by the receiver as header, then payload; "hdr+4KiB",
// the same with small chunks (compressed or tail chunks). Besides the
// throughput, cpu-ns/B is the CPU time (user + system, both ends: they run
// in this process) per byte moved, which a busy machine disturbs less.
func BenchmarkLink(b *testing.B) {
	cases := []struct {
		kind, mode string
		hostID     func(int) string
	}{
		{LinkShm, DataPlaneAuto, nil},
		{LinkUnix, DataPlaneAuto, nil},
		{LinkLibp2pTLS, DataPlaneLibp2p, otherHosts},
		{LinkTCPTLS, DataPlaneAuto, otherHosts},
		{LinkTCPPlaintext, DataPlanePlaintext, otherHosts},
	}
	shapes := []struct {
		name         string
		hdr, payload int
	}{
		{"1MiB", 0, 1 << 20},
		{"hdr+256KiB", 56, 256 << 10},
		{"hdr+4KiB", 56, 4 << 10},
	}
	const total = 64 << 20
	for _, c := range cases {
		b.Run(c.kind, func(b *testing.B) {
			j := startJob(b, jobOpts{size: 2, mode: c.mode, hostID: c.hostID, timeout: 30 * time.Second, noShm: c.kind == LinkUnix})
			if k := j.nodes[0].Peers()[1].Link; k != c.kind {
				b.Fatalf("link is %s, want %s", k, c.kind)
			}
			send, recv := j.nodes[0].Transport(), j.nodes[1].Transport()
			ctx := context.Background()
			for _, sh := range shapes {
				b.Run(sh.name, func(b *testing.B) {
					shdr, rhdr := make([]byte, sh.hdr), make([]byte, sh.hdr)
					src, dst := make([]byte, sh.payload), make([]byte, sh.payload)
					msgs := total / sh.payload
					b.SetBytes(total)
					cpu0 := cpuTime()
					b.ResetTimer()
					for range b.N {
						var wg sync.WaitGroup
						wg.Add(1)
						var rerr error
						go func() {
							defer wg.Done()
							for range msgs {
								if sh.hdr > 0 {
									if rerr = recv.RecvPrev(ctx, rhdr); rerr != nil {
										return
									}
								}
								if rerr = recv.RecvPrev(ctx, dst); rerr != nil {
									return
								}
							}
						}()
						for range msgs {
							var err error
							if sh.hdr > 0 {
								err = send.SendNext(ctx, shdr, src)
							} else {
								err = send.SendNext(ctx, src)
							}
							if err != nil {
								b.Fatal(err)
							}
						}
						wg.Wait()
						if rerr != nil {
							b.Fatal(rerr)
						}
					}
					b.StopTimer()
					b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N*total), "cpu-ns/B")
				})
			}
		})
	}
}

// BenchmarkPingPong measures the latency of same-host links, shared memory
// and unix sockets in the same run (compare the ratio: the machine may be
// busy): rank 0 sends a message to rank 1, which sends it back. ns/op is
// one round trip, two hops.
func BenchmarkPingPong(b *testing.B) {
	for _, kind := range []string{LinkShm, LinkUnix} {
		b.Run(kind, func(b *testing.B) {
			j := startJob(b, jobOpts{size: 2, timeout: 30 * time.Second, noShm: kind == LinkUnix})
			if k := j.nodes[0].Peers()[1].Link; k != kind {
				b.Fatalf("link is %s, want %s", k, kind)
			}
			ping, pong := j.nodes[0].Transport(), j.nodes[1].Transport()
			for _, size := range []int{4, 64 << 10} {
				b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					out, in, echo := make([]byte, size), make([]byte, size), make([]byte, size)
					echoed := make(chan error, 1)
					b.ResetTimer()
					go func() {
						for range b.N {
							if err := pong.RecvPrev(ctx, echo); err != nil {
								echoed <- err
								return
							}
							if err := pong.SendNext(ctx, echo); err != nil {
								echoed <- err
								return
							}
						}
						echoed <- nil
					}()
					for range b.N {
						if err := ping.SendNext(ctx, out); err != nil {
							b.Fatal(err)
						}
						if err := ping.RecvPrev(ctx, in); err != nil {
							b.Fatal(err)
						}
					}
					if err := <-echoed; err != nil {
						b.Fatal(err)
					}
				})
			}
		})
	}
}
