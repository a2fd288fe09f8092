package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/gorun/gorun/compress"
	"github.com/gorun/gorun/ring"
)

// Gradient compression.
//
// A compressed Allreduce sends each rank's share of every segment, encoded,
// straight to the rank that owns the segment; the owner sums in float32,
// encodes the sum once, and every rank decodes the same bytes (see
// ring/compressed.go). Error feedback keeps, per named tensor, what the
// encodings lost and adds it to the next call, so nothing is lost over
// time. Compression applies to Sum and Avg allreduces of float32 buffers of
// at least the threshold; everything else travels uncompressed.

// DefaultCompressionThreshold is the smallest buffer compressed by default:
// below it an allreduce is bound by latency, and encoding would only add
// work. A job across hosts takes the size from which its measured links
// say the codec pays instead (adoptLinks, links.go).
const DefaultCompressionThreshold = 64 << 10

// EnvCompression and EnvCompressionThreshold set the Comm's default codec
// ("none", "fp16", "bf16", "int8") and threshold in bytes.
const (
	EnvCompression          = "GORUN_COMPRESSION"
	EnvCompressionThreshold = "GORUN_COMPRESSION_THRESHOLD"
)

type compressionConfig struct {
	codec      compress.Codec
	threshold  int
	noFeedback bool
	set        bool // threshold set by an option
	// byDefault: neither an option nor the environment set the
	// threshold, so a job across hosts may take it from its links
	// (adoptLinks).
	byDefault bool
}

// WithCompression compresses this Comm's eligible allreduces with codec,
// e.g. compress.Int8(). Per call, Compression overrides it.
func WithCompression(codec compress.Codec) Option {
	return func(c *config) { c.compression.codec = codec }
}

// WithCompressionThreshold sets the smallest buffer, in bytes, that is
// compressed (default 64 KiB; across hosts, what the links call for).
func WithCompressionThreshold(bytes int) Option {
	return func(c *config) { c.compression.threshold, c.compression.set = bytes, true }
}

// WithoutErrorFeedback turns error feedback off: each compressed allreduce
// then stands alone, and its rounding bias accumulates over steps.
func WithoutErrorFeedback() Option {
	return func(c *config) { c.compression.noFeedback = true }
}

// Compression compresses one Allreduce with the named codec ("none" turns
// compression off for the call). Every rank must make the same choice: it
// is part of the call's fingerprint. A codec given to WithCompression keeps
// its parameters; other names use the codec's defaults.
func Compression(codec string) CallOption {
	return func(c *ring.Call) {
		if codec == "none" {
			codec = ""
		}
		c.Codec = codec
	}
}

// CompressionStats describe what compression did, for a Comm or for one
// named tensor.
type CompressionStats struct {
	Calls     uint64  // compressed allreduces
	RawBytes  uint64  // bytes the uncompressed ring would have sent
	WireBytes uint64  // payload bytes actually sent
	Clamped   uint64  // values clamped to the format's range (fp16)
	RelRMSE   float64 // relative RMS error of this rank's encoded shares, last call
}

// CompressionThreshold is the smallest buffer, in bytes, that this Comm
// compresses (WithCompressionThreshold, GORUN_COMPRESSION_THRESHOLD, what
// the measured links call for across hosts, or
// DefaultCompressionThreshold).
func (c *Comm) CompressionThreshold() int { return c.compression.cfg.threshold }

// Ratio is WireBytes/RawBytes.
func (s CompressionStats) Ratio() float64 {
	if s.RawBytes == 0 {
		return 0
	}
	return float64(s.WireBytes) / float64(s.RawBytes)
}

type compressionState struct {
	cfg    compressionConfig
	mu     sync.Mutex
	codecs map[string]compress.Codec
	fb     map[string]*ring.Feedback
	total  CompressionStats
	per    map[string]CompressionStats
}

func newCompressionState(cfg compressionConfig, getenv func(string) string) (*compressionState, error) {
	if cfg.codec == nil {
		if name := getenv(EnvCompression); name != "" {
			codec, err := compress.ByName(name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", EnvCompression, err)
			}
			cfg.codec = codec
		}
	}
	if !cfg.set {
		cfg.threshold, cfg.byDefault = DefaultCompressionThreshold, true
		if s := getenv(EnvCompressionThreshold); s != "" {
			cfg.byDefault = false
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%s=%q is not a byte count", EnvCompressionThreshold, s)
			}
			cfg.threshold = n
		}
	}
	s := &compressionState{cfg: cfg, codecs: map[string]compress.Codec{},
		fb: map[string]*ring.Feedback{}, per: map[string]CompressionStats{}}
	if cfg.codec != nil {
		s.codecs[cfg.codec.Name()] = cfg.codec
	}
	return s, nil
}

// defaultName is the codec a new Allreduce starts with.
func (s *compressionState) defaultName() string {
	if s.cfg.codec == nil || s.cfg.codec.Name() == "none" {
		return ""
	}
	return s.cfg.codec.Name()
}

// gate drops the codec from calls that compression does not apply to. Every
// rank applies the same rule to the same call, so they agree.
func (s *compressionState) gate(call ring.Call) ring.Call {
	if call.Codec != "" && (call.DType != ring.Float32 || (call.Op != Sum && call.Op != Avg) ||
		call.Count*4 < s.cfg.threshold) {
		call.Codec = ""
	}
	return call
}

func (s *compressionState) codec(name string) (compress.Codec, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.codecs[name]; ok {
		return c, nil
	}
	c, err := compress.ByName(name)
	if err != nil {
		return nil, err
	}
	s.codecs[name] = c
	return c, nil
}

// feedback returns the residuals of a named tensor, resetting them when the
// tensor's length changed. Unnamed calls get none: nothing identifies the
// tensor from one call to the next.
func (s *compressionState) feedback(name string, count, size, rank int) *ring.Feedback {
	if name == "" || s.cfg.noFeedback {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fb := s.fb[name]
	_, own := ring.Segment(count, size, rank)
	switch {
	case fb == nil || len(fb.Contrib) != count:
		fb = &ring.Feedback{Contrib: make([]float32, count), Owner: make([]float32, own)}
		s.fb[name] = fb
	case len(fb.Owner) != own:
		// The ring's segments changed (an elastic job changed size): what
		// this rank's shares lost still applies, its old segment does not.
		fb.Owner = make([]float32, own)
	}
	return fb
}

func (s *compressionState) record(name string, st ring.CompressionStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	add := func(t *CompressionStats) {
		t.Calls++
		t.RawBytes += uint64(st.RawBytes)
		t.WireBytes += uint64(st.WireBytes)
		t.Clamped += uint64(st.Clamped)
		t.RelRMSE = st.RelRMSE
	}
	add(&s.total)
	if name != "" {
		t := s.per[name]
		add(&t)
		s.per[name] = t
	}
}

func (c *Comm) allreduceCompressed(ctx context.Context, call ring.Call, v view) error {
	codec, err := c.compression.codec(call.Codec)
	if err != nil {
		return err
	}
	cv := c.cur()
	fb := c.compression.feedback(call.Name, v.count, cv.size, cv.rank)
	st, err := cv.ring.AllreduceCompressed(ctx, call, v.bytes, codec, fb)
	if err == nil {
		c.compression.record(call.Name, st)
		if st.Clamped > 0 {
			c.logf("rank %d: %s: %d values beyond %s's range were clamped", cv.rank, call, st.Clamped, call.Codec)
		}
	}
	return err
}

// CompressionStats returns this rank's compression counters: the total,
// and per named tensor.
func (c *Comm) CompressionStats() (total CompressionStats, perTensor map[string]CompressionStats) {
	s := c.compression
	s.mu.Lock()
	defer s.mu.Unlock()
	perTensor = make(map[string]CompressionStats, len(s.per))
	for k, v := range s.per {
		perTensor[k] = v
	}
	return s.total, perTensor
}

// ResetResiduals forgets the error-feedback residuals of the named tensors,
// or of every tensor when none is named (e.g. after loading a checkpoint).
func (c *Comm) ResetResiduals(names ...string) {
	s := c.compression
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(names) == 0 {
		clear(s.fb)
		return
	}
	for _, n := range names {
		delete(s.fb, n)
	}
}

// residualsName is the unique-state name under which an ElasticState
// commits the Comm's error-feedback residuals (elastic.go).
const residualsName = "gorun/compression-residuals"

// saveResiduals serializes the error-feedback residuals, for the commit of
// an elastic job: they are rank-unique state (what this rank's encodings
// lost). Nil when there are none.
func (s *compressionState) saveResiduals(v *commView) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fb) == 0 {
		return nil
	}
	le := binary.LittleEndian
	out := le.AppendUint32(nil, uint32(v.size))
	out = le.AppendUint32(out, uint32(v.rank))
	names := slices.Sorted(maps.Keys(s.fb))
	for _, name := range names {
		fb := s.fb[name]
		out = le.AppendUint32(out, uint32(len(name)))
		out = append(out, name...)
		for _, x := range [][]float32{fb.Contrib, fb.Owner} {
			out = le.AppendUint64(out, uint64(len(x)))
			out = append(out, bytesOf(x)...)
		}
	}
	return out
}

func parseResiduals(b []byte) (size, rank int, fbs map[string]*ring.Feedback, err error) {
	le := binary.LittleEndian
	if len(b) < 8 {
		return 0, 0, nil, errors.New("truncated residuals")
	}
	size, rank, b = int(le.Uint32(b)), int(le.Uint32(b[4:])), b[8:]
	fbs = map[string]*ring.Feedback{}
	for len(b) > 0 {
		if len(b) < 4 || len(b) < 4+int(le.Uint32(b)) {
			return 0, 0, nil, errors.New("truncated residuals")
		}
		n := int(le.Uint32(b))
		name := string(b[4 : 4+n])
		b = b[4+n:]
		var xs [2][]float32
		for i := range xs {
			if len(b) < 8 || uint64(len(b)-8)/4 < le.Uint64(b) {
				return 0, 0, nil, errors.New("truncated residuals")
			}
			m := int(le.Uint64(b))
			xs[i] = make([]float32, m)
			copy(bytesOf(xs[i]), b[8:8+4*m])
			b = b[8+4*m:]
		}
		fbs[name] = &ring.Feedback{Contrib: xs[0], Owner: xs[1]}
	}
	return size, rank, fbs, nil
}

// restoreResiduals puts back this rank's residuals as of its last commit
// (own; none on a joiner) and adds in those of a lost predecessor
// (adopted) where the tensor has the same length, so what the lost rank's
// encodings owed is not lost. Owner residuals belong to the segment a rank
// owned in the old ring; when the ring changed they are reset. It returns
// notes on what was reset.
func (s *compressionState) restoreResiduals(own []byte, adopted [][]byte, size, rank int) []string {
	var notes []string
	fbs := map[string]*ring.Feedback{}
	if own != nil {
		sz, rk, m, err := parseResiduals(own)
		if err != nil {
			notes = append(notes, fmt.Sprintf("compression residuals reset: %v", err))
		} else {
			fbs = m
			if sz != size || rk != rank {
				for _, fb := range fbs {
					_, n := ring.Segment(len(fb.Contrib), size, rank)
					fb.Owner = make([]float32, n)
				}
				if len(fbs) > 0 {
					notes = append(notes, fmt.Sprintf("owner-side compression residuals of %d tensors reset: the ring's segments changed (rank %d of %d -> %d of %d)", len(fbs), rk, sz, rank, size))
				}
			}
		}
	}
	for _, a := range adopted {
		_, _, m, err := parseResiduals(a)
		if err != nil {
			notes = append(notes, fmt.Sprintf("the lost rank's compression residuals dropped: %v", err))
			continue
		}
		for name, fb := range m {
			mine := fbs[name]
			if mine == nil || len(mine.Contrib) != len(fb.Contrib) {
				notes = append(notes, fmt.Sprintf("the lost rank's compression residuals of %q dropped: this rank has none of that shape", name))
				continue
			}
			for i, x := range fb.Contrib {
				mine.Contrib[i] += x
			}
		}
	}
	s.mu.Lock()
	s.fb = fbs
	s.mu.Unlock()
	return notes
}
