package s3test

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
)

// Fault is what a Proxy does with a request.
type Fault int

const (
	// Pass forwards the request to the server.
	Pass Fault = iota
	// Hang holds the request, unanswered, until its fault is lifted (it is
	// then forwarded) or the client gives up: a server that stopped
	// answering, for these requests only.
	Hang
	// Drop closes the connection without an answer: a server that went
	// away, for these requests only (the client sees EOF or a reset).
	Drop
)

// A Proxy stands between the code under test and a Server and fails the
// requests a test chooses, by HTTP method, while the server itself stays
// up: an outage of deletions only (DELETE is DeleteObject and
// AbortMultipartUpload), or of every request. The code under test reaches
// it through Env or Setenv, as it would the server; signed requests pass
// unchanged (the Host header they were signed with is kept).
type Proxy struct {
	srv      *Server
	endpoint string
	hs       *http.Server

	mu      sync.Mutex
	faults  map[string]Fault // by method; "" for every method
	lifted  chan struct{}    // closed (and replaced) whenever faults change
	faulted chan string      // the method and path of each faulted request
}

// StartProxy starts a Proxy to s on a free loopback port; it passes every
// request until told otherwise (Set), and stops when the test ends.
func (s *Server) StartProxy() *Proxy {
	t := s.t
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(s.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{srv: s, endpoint: "http://" + l.Addr().String(), faults: map[string]Fault{},
		lifted: make(chan struct{}), faulted: make(chan string, 1024)}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host // what the request was signed with
		},
		FlushInterval: -1,
	}
	p.hs = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.hold(r) {
			rp.ServeHTTP(w, r)
			return
		}
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // closes the connection too
	})}
	go p.hs.Serve(l)
	t.Cleanup(func() { p.hs.Close() })
	return p
}

// Endpoint is the proxy's URL, http://127.0.0.1:port.
func (p *Proxy) Endpoint() string { return p.endpoint }

// Env is the server's Env (see Server.Env) with the proxy's endpoint.
func (p *Proxy) Env() []string { return p.srv.envFor(p.endpoint) }

// Setenv sets Env in this process for the rest of t (t.Setenv).
func (p *Proxy) Setenv(t testing.TB) {
	t.Helper()
	setenv(t, p.Env())
}

// Set makes the requests of method ("" for every method not set on its
// own) meet f from now on; requests held by Hang go on as f says.
func (p *Proxy) Set(method string, f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[method] = f
	close(p.lifted)
	p.lifted = make(chan struct{})
}

// Faulted receives "METHOD /path" for every request that met a fault (as
// it is held or dropped), so that a test can wait until the code under
// test ran into the outage.
func (p *Proxy) Faulted() <-chan string { return p.faulted }

// hold applies the request's fault: it returns true when the request is to
// be forwarded, false when it is to be dropped, after holding it while its
// fault is Hang.
func (p *Proxy) hold(r *http.Request) bool {
	told := false
	for {
		p.mu.Lock()
		f, ok := p.faults[r.Method]
		if !ok {
			f = p.faults[""]
		}
		lifted := p.lifted
		p.mu.Unlock()
		if f != Pass && !told {
			told = true
			select {
			case p.faulted <- r.Method + " " + r.URL.Path:
			default: // nobody reads: the test does not wait for it
			}
		}
		switch f {
		case Pass:
			return true
		case Drop:
			return false
		}
		select {
		case <-lifted:
		case <-r.Context().Done(): // the client gave up
			return false
		}
	}
}
