package etcdlog

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// TLS is how a client reaches an etcd cluster that serves TLS: the PEM
// files of torchrun's --rdzv-conf (cacert, cert, key). CACert empty: the
// system's roots; Cert and Key: a client certificate, for a cluster that
// checks its clients (--client-cert-auth), both or neither.
type TLS struct {
	CACert, Cert, Key string
}

// Config loads the files into a client's TLS configuration; an error names
// the file and what is wrong with it.
func (t *TLS) Config() (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CACert != "" {
		pem, err := os.ReadFile(t.CACert)
		if err != nil {
			return nil, fmt.Errorf("etcd's CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd's CA certificate %s: no PEM certificate in it", t.CACert)
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.Cert == "" && t.Key == "":
	case t.Cert == "" || t.Key == "":
		return nil, errors.New("a client certificate for etcd needs both its cert and its key")
	default:
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate %s with key %s: %w", t.Cert, t.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// ParseConf reads torchrun's --rdzv-conf (PET_RDZV_CONF), "key=value,...",
// for what an etcd client takes from it: protocol (http or https), cacert,
// cert and key. It returns nil without TLS; other keys are torchrun's own
// (timeouts, is_host) and left alone.
func ParseConf(s string) (*TLS, error) {
	var t TLS
	https := false
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		switch k, v = strings.TrimSpace(k), strings.TrimSpace(v); k {
		case "protocol":
			switch v {
			case "http":
			case "https":
				https = true
			default:
				return nil, fmt.Errorf("protocol=%s: want http or https", v)
			}
		case "cacert":
			t.CACert = v
		case "cert":
			t.Cert = v
		case "key":
			t.Key = v
		}
	}
	if !https && t == (TLS{}) {
		return nil, nil
	}
	return &t, nil
}

// tlsProbeTimeout bounds tlsProblem's handshake with one endpoint.
const tlsProbeTimeout = 2 * time.Second

// tlsProblem says why etcd's client may have got no answer: its gRPC
// dial retries a failed TLS handshake until the call's deadline, which
// then is all it reports. One handshake with the first endpoint that
// answers gives the cause: a certificate that does not verify, a client
// certificate refused; or, over plain TCP (cfg nil), a server that speaks
// TLS. It returns nil when it finds no such cause.
func tlsProblem(endpoints []string, cfg *tls.Config) error {
	for _, ep := range endpoints {
		host, _, _ := net.SplitHostPort(ep)
		probe := &tls.Config{InsecureSkipVerify: true} // only: does it speak TLS?
		if cfg != nil {
			probe = cfg.Clone()
			if probe.ServerName == "" {
				probe.ServerName = host
			}
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: tlsProbeTimeout}, "tcp", ep, probe)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.ECONNREFUSED) {
			continue // not there: nothing to say about TLS
		}
		if cfg == nil {
			// Anything but a reply that is not TLS at all says it speaks TLS.
			var notTLS tls.RecordHeaderError
			if err == nil || !errors.As(err, &notTLS) && !errors.Is(err, io.EOF) {
				if conn != nil {
					conn.Close()
				}
				return fmt.Errorf("etcd at %s serves TLS: give https:// endpoints, or its CA (and a client certificate) in --rdzv-conf / GORUN_RDZV_CONF", ep)
			}
			return nil
		}
		if err == nil {
			// A server that checks client certificates may refuse one
			// only at the first read.
			conn.SetReadDeadline(time.Now().Add(tlsProbeTimeout))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
			if err == nil || errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
		}
		return fmt.Errorf("TLS with etcd at %s: %w", ep, err)
	}
	return nil
}
