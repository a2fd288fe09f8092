package collective

import (
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/p2p"
	"github.com/gorun/gorun/ring"
)

// TuningEnv are the tuning variables: gorun hands those set in its own
// environment to every rank, remote ones included, because ranks that
// disagree on them fail (an allreduce algorithm is part of every message's
// fingerprint) or lose speed.
var TuningEnv = []string{EnvAllreduceAlgorithms, EnvChunkBytes, EnvDataPlane, EnvPollUS, EnvShm, EnvShmBytes}

// The environment contract. gorun sets the GORUN_* variables for every rank;
// the others are read so that the same binary also runs under mpirun, Slurm
// or torchrun without gorun.
const (
	EnvRank           = "GORUN_RANK"            // this process's rank, 0..size-1
	EnvSize           = "GORUN_SIZE"            // number of ranks in the job
	EnvLocalRank      = "GORUN_LOCAL_RANK"      // rank among the ranks on this host
	EnvLocalSize      = "GORUN_LOCAL_SIZE"      // number of ranks on this host
	EnvHost           = "GORUN_HOST"            // this rank's host as named in gorun's -H, hostfile or discovery script ("localhost" for a job on one host)
	EnvRendezvous     = "GORUN_RENDEZVOUS"      // host:port of the rendezvous hosted by gorun
	EnvRendezvousAddr = "GORUN_RENDEZVOUS_ADDR" // host:port rank 0 hosts the rendezvous on (without gorun)
	EnvJobKey         = "GORUN_JOB_KEY"         // hex job key proving membership
	EnvJobKeyFile     = "GORUN_JOB_KEY_FILE"    // file holding the hex job key
	EnvTimeout        = "GORUN_TIMEOUT"         // collective timeout, a Go duration ("60s") or seconds
	EnvListenIP       = "GORUN_LISTEN_IP"       // IP this rank listens on and advertises
	EnvDataPlane      = "GORUN_DATA_PLANE"      // auto | tls | plaintext | libp2p
	EnvRestartCount   = "GORUN_RESTART_COUNT"   // how many times gorun restarted the job
	EnvVerbose        = "GORUN_VERBOSE"         // non-empty: print connection diagnostics
	EnvChunkBytes     = "GORUN_CHUNK_BYTES"     // ring pipelining chunk size in bytes (tuning)

	// EnvAllreduceAlgorithms chooses the allreduce algorithm by buffer
	// size (tuning; see ring.ParseAllreducePolicy): comma-separated
	// name:max-bytes entries, the last without a size, e.g.
	// "direct:4K,scatter-gather:2M,ring" (up to 4 KiB direct, up to 2 MiB
	// scatter-gather, above that the ring). Sizes are bytes with an
	// optional K, M or G suffix (binary). A single name forces that
	// algorithm for every size: ring, direct, recursive-doubling,
	// rabenseifner, scatter-gather or hierarchical. Unset, "" or "default":
	// the measured defaults for the job's size and links, which add the
	// hierarchical allreduce from 512 KiB when every host runs the same
	// number (two or more) of ranks; a policy that is given is obeyed as
	// it is. Every rank must
	// use the same value (the algorithm is part of every message's call
	// fingerprint, so ranks that disagree fail with a mismatch error); a
	// value that does not parse fails Init.
	EnvAllreduceAlgorithms = "GORUN_ALLREDUCE_ALGORITHMS"

	// EnvShm "0" (or off, false, no) keeps ranks of one host on unix
	// sockets instead of shared-memory links; a pair uses shared memory
	// only if both ranks allow it (tuning).
	EnvShm = "GORUN_SHM"
	// EnvShmBytes is the size of each shared-memory link's ring buffer in
	// bytes, rounded up to a power of two (default 2 MiB; tuning).
	EnvShmBytes = "GORUN_SHM_BYTES"
	// EnvPollUS is how long, in microseconds, a receive polls before it
	// sleeps (default 50; 0 sleeps at once; tuning).
	EnvPollUS = "GORUN_POLL_US"

	// EnvElastic is "1" in an elastic job (gorun --min-np/--max-np or a
	// host discovery script): a lost member re-forms the job in place
	// instead of stopping it (see RunElastic). A joiner, started to join a
	// running job, gets GORUN_RANK=-1; its GORUN_SIZE is then the job's
	// initial -np and is ignored (the rendezvous assigns rank and size).
	EnvElastic = "GORUN_ELASTIC"
	// EnvHeartbeatTimeout is the heartbeat bound of an elastic job, a Go
	// duration ("3s") or seconds: a member silent for that long counts as
	// lost. Every member and the rendezvous use the same value (gorun sets
	// it); 3s when unset.
	EnvHeartbeatTimeout = "GORUN_HEARTBEAT_TIMEOUT"
)

// DefaultTimeout bounds every collective unless WithTimeout or GORUN_TIMEOUT
// says otherwise.
const DefaultTimeout = 60 * time.Second

// launchEnv is what Init learns from the environment: who we are and how to
// find the rest of the job.
type launchEnv struct {
	source               string // "gorun", "mpirun", "slurm", "torchrun" or "" (none)
	rank, size           int
	localRank, localSize int
	rendezvous           string // host:port
	hostRendezvous       bool   // rank 0 must host the rendezvous itself
	jobKey               []byte
	elastic              bool          // GORUN_ELASTIC=1; rank -1 is a joiner
	heartbeat            time.Duration // GORUN_HEARTBEAT_TIMEOUT, 0 if unset
}

// readEnv reads the launch environment through getenv (os.Getenv in
// production, a map in tests).
func readEnv(getenv func(string) string) (launchEnv, error) {
	var e launchEnv
	e.localRank, e.localSize = -1, -1
	ints := func(names ...string) ([]int, bool, error) {
		out := make([]int, len(names))
		for i, n := range names {
			v := getenv(n)
			if v == "" {
				if i == 0 {
					return nil, false, nil
				}
				out[i] = -1
				continue
			}
			x, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return nil, true, fmt.Errorf("%s=%q is not an integer", n, v)
			}
			out[i] = x
		}
		return out, true, nil
	}
	type source struct {
		name  string
		vars  []string // rank, size, local rank, local size
		check string   // variable whose presence selects this source
	}
	sources := []source{
		{"gorun", []string{EnvRank, EnvSize, EnvLocalRank, EnvLocalSize}, EnvRank},
		{"mpirun", []string{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}, "OMPI_COMM_WORLD_RANK"},
		{"slurm", []string{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"}, "SLURM_PROCID"},
		{"torchrun", []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}, "RANK"},
	}
	for _, s := range sources {
		if getenv(s.check) == "" {
			continue
		}
		v, _, err := ints(s.vars...)
		if err != nil {
			return e, err
		}
		if v[1] < 0 {
			return e, fmt.Errorf("%s is set but %s is not: set both", s.vars[0], s.vars[1])
		}
		e.source = s.name
		e.rank, e.size, e.localRank, e.localSize = v[0], v[1], v[2], v[3]
		break
	}
	if e.source == "" {
		return e, nil
	}
	switch v := strings.TrimSpace(getenv(EnvElastic)); v {
	case "", "0":
	case "1":
		e.elastic = true
	default:
		return e, fmt.Errorf("%s=%q: want 1 (elastic) or 0", EnvElastic, v)
	}
	if s := getenv(EnvHeartbeatTimeout); s != "" {
		d, err := parseDuration(EnvHeartbeatTimeout, s)
		if err != nil || d <= 0 {
			return e, fmt.Errorf("%s=%q is not a positive duration (write 3s)", EnvHeartbeatTimeout, s)
		}
		e.heartbeat = d
	}
	joiner := e.elastic && e.rank == -1
	if joiner {
		// A joiner's rank and size come from the rendezvous.
		e.size = max(e.size, 1)
	}
	if e.rank == -1 && !e.elastic {
		return e, fmt.Errorf("rank -1 (a joiner) from %s environment, but the job is not elastic (%s is not 1)", e.source, EnvElastic)
	}
	if !joiner && (e.size < 1 || e.rank < 0 || e.rank >= e.size) {
		return e, fmt.Errorf("rank %d is not within a job of size %d (from %s environment)", e.rank, e.size, e.source)
	}
	if e.localRank < 0 {
		e.localRank = 0
	}
	if e.localSize < 1 {
		e.localSize = 1
	}

	switch {
	case getenv(EnvRendezvous) != "":
		e.rendezvous = getenv(EnvRendezvous)
	case getenv(EnvRendezvousAddr) != "":
		e.rendezvous, e.hostRendezvous = getenv(EnvRendezvousAddr), true
	case getenv("MASTER_ADDR") != "" && getenv("MASTER_PORT") != "":
		e.rendezvous, e.hostRendezvous = net.JoinHostPort(getenv("MASTER_ADDR"), getenv("MASTER_PORT")), true
	}
	if (e.size > 1 || e.elastic) && e.rendezvous == "" {
		return e, fmt.Errorf("rank %d of %d (from %s environment): no rendezvous address: launch with gorun, or set %s or MASTER_ADDR and MASTER_PORT",
			e.rank, e.size, e.source, EnvRendezvousAddr)
	}

	key, err := readJobKey(getenv)
	if err != nil {
		return e, err
	}
	if (e.size > 1 || e.elastic) && key == nil {
		return e, fmt.Errorf("rank %d of %d: no job key: set %s (hex) or %s; every rank of the job must use the same key (gorun sets it for you)",
			e.rank, e.size, EnvJobKey, EnvJobKeyFile)
	}
	e.jobKey = key
	return e, nil
}

func readJobKey(getenv func(string) string) ([]byte, error) {
	text, from := getenv(EnvJobKey), EnvJobKey
	if text == "" && getenv(EnvJobKeyFile) != "" {
		from = getenv(EnvJobKeyFile)
		b, err := os.ReadFile(from)
		if err != nil {
			return nil, fmt.Errorf("reading job key: %w", err)
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

// parseTimeout accepts a Go duration ("90s", "2m") or plain seconds ("90").
func parseTimeout(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		if secs <= 0 {
			return 0, fmt.Errorf("%s=%q must be positive", EnvTimeout, s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%q is not a positive duration (write 60s or 60)", EnvTimeout, s)
	}
	return d, nil
}

// readAllreducePolicy reads GORUN_ALLREDUCE_ALGORITHMS through getenv; unset
// is the zero policy (the ring's measured defaults).
func readAllreducePolicy(getenv func(string) string) (ring.AllreducePolicy, error) {
	p, err := ring.ParseAllreducePolicy(getenv(EnvAllreduceAlgorithms))
	if err != nil {
		return p, fmt.Errorf("%s: %w", EnvAllreduceAlgorithms, err)
	}
	return p, nil
}

// hostIndices returns, for every rank of peers (in rank order), the index
// of its host: ranks with equal HostIDs get equal indices, numbered in the
// order of their first rank (ring.Config.Hosts). It returns nil for fewer
// than two ranks, or when a HostID is unknown.
func hostIndices(peers []p2p.Peer) []int {
	if len(peers) < 2 {
		return nil
	}
	out := make([]int, len(peers))
	ids := make(map[string]int, len(peers))
	for i, p := range peers {
		if p.Rank != i || p.HostID == "" {
			return nil
		}
		idx, ok := ids[p.HostID]
		if !ok {
			idx = len(ids)
			ids[p.HostID] = idx
		}
		out[i] = idx
	}
	return out
}
