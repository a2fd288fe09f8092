package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certFiles are the PEM files of StartTLS's cluster: its CA, its members'
// certificate (for 127.0.0.1) and its clients'.
type certFiles struct {
	ca, server, serverKey, client, clientKey string
}

// writeCerts makes a CA and two certificates it signs, for a day, into dir.
func writeCerts(dir string) (certFiles, error) {
	f := certFiles{ca: filepath.Join(dir, "ca.pem"),
		server: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server-key.pem"),
		client: filepath.Join(dir, "client.pem"), clientKey: filepath.Join(dir, "client-key.pem")}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	if err := writePEM(f.ca, "CERTIFICATE", caDER); err != nil {
		return f, err
	}
	for i, leaf := range []struct {
		name, cert, key string
		usage           x509.ExtKeyUsage
	}{
		{"etcdtest member", f.server, f.serverKey, x509.ExtKeyUsageServerAuth},
		{"etcdtest client", f.client, f.clientKey, x509.ExtKeyUsageClientAuth},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return f, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: leaf.name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{leaf.usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return f, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return f, err
		}
		if err := writePEM(leaf.cert, "CERTIFICATE", der); err != nil {
			return f, err
		}
		if err := writePEM(leaf.key, "EC PRIVATE KEY", keyDER); err != nil {
			return f, err
		}
	}
	return f, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}
