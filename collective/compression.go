package collective

import (
	"context"
	"fmt"
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
// work.
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
}

// WithCompression compresses this Comm's eligible allreduces with codec,
// e.g. compress.Int8(). Per call, Compression overrides it.
func WithCompression(codec compress.Codec) Option {
	return func(c *config) { c.compression.codec = codec }
}

// WithCompressionThreshold sets the smallest buffer, in bytes, that is
// compressed (default 64 KiB).
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
// compresses (WithCompressionThreshold, GORUN_COMPRESSION_THRESHOLD, or
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
		cfg.threshold = DefaultCompressionThreshold
		if s := getenv(EnvCompressionThreshold); s != "" {
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
	if fb == nil || len(fb.Contrib) != count || len(fb.Owner) != own {
		fb = &ring.Feedback{Contrib: make([]float32, count), Owner: make([]float32, own)}
		s.fb[name] = fb
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
	fb := c.compression.feedback(call.Name, v.count, c.size, c.rank)
	st, err := c.ring.AllreduceCompressed(ctx, call, v.bytes, codec, fb)
	if err == nil {
		c.compression.record(call.Name, st)
		if st.Clamped > 0 {
			c.logf("rank %d: %s: %d values beyond %s's range were clamped", c.rank, call, st.Clamped, call.Codec)
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
