package p2p

import (
	"bytes"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

func encode(t testing.TB, m *msg) []byte {
	var b bytes.Buffer
	if err := writeMsg(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

var (
	fuzzKey   = []byte("0123456789abcdef0123456789abcdef")
	fuzzNonce = bytes.Repeat([]byte{7}, nonceLen)
	fuzzPeer  = "12D3KooWGRUVh5V2xn9ndvkMFPy2gfjEEPhPbTsaVQJyqrDzyn7r"
)

func seedMessages(t testing.TB) [][]byte {
	ms := []*msg{
		{T: tChallenge, Nonce: fuzzNonce},
		{T: tHello, Rank: 1, Nonce: fuzzNonce, Proof: registerProof(fuzzKey, fuzzNonce, fuzzPeer, 1),
			Addrs: []string{"/ip4/127.0.0.1/tcp/4001"}, HostID: "h/net:[1]/b", Unix: "@gorun-x", TCPPort: 9, TLSPort: 10},
		{T: tWelcome, Proof: welcomeProof(fuzzKey, fuzzNonce, fuzzPeer)},
		{T: tError, Text: "rank 3 out of range"},
		{T: tTable, Table: []tableItem{{Rank: 0, ID: fuzzPeer, Addrs: []string{"/ip4/127.0.0.1/tcp/1"}, HostID: "h"}}},
		{T: tAck}, {T: tGo}, {T: tPing, Missing: []int{2, 3}}, {T: tAbort, Rank: 2, Text: "boom"}, {T: tAbortOK, Rank: 2},
		{T: tLeave, Rank: 1}, {T: tBye},
		{T: tDChal, Nonce: fuzzNonce},
		{T: tDHello, Rank: 0, Link: 0, Nonce: fuzzNonce, Proof: dataProof(fuzzKey, fuzzNonce, 0, 0, 0)},
		{T: tDOK, Proof: dataOKProof(fuzzKey, fuzzNonce, 1, 0, 0)},
	}
	var out [][]byte
	for _, m := range ms {
		out = append(out, encode(t, m))
	}
	return append(out, []byte{0xff, 0xff, 0xff, 0xff}, []byte{0, 0, 0, 2, '{', '}'})
}

// FuzzDecodeMessage: the framed decoder used on every control and data
// handshake stream never panics, never accepts an oversized frame, and what
// it accepts re-encodes to something it accepts again.
func FuzzDecodeMessage(f *testing.F) {
	for _, s := range seedMessages(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := readMsg(bytes.NewReader(data))
		if err != nil {
			return
		}
		again, err := readMsg(bytes.NewReader(encode(t, m)))
		if err != nil {
			t.Fatalf("re-decode of accepted %q failed: %v", m.T, err)
		}
		if again.T != m.T {
			t.Fatalf("type changed %q -> %q", m.T, again.T)
		}
	})
}

// FuzzDecodeRegister: the rendezvous' processing of a hello (decode, proof
// check, rank range) never panics and never accepts a wrong proof.
func FuzzDecodeRegister(f *testing.F) {
	for _, s := range seedMessages(f) {
		f.Add(s, 4)
	}
	f.Fuzz(func(t *testing.T, data []byte, size int) {
		m, err := decodeMsg(data)
		if err != nil || m.T != tHello {
			return
		}
		ok := bytes.Equal(m.Proof, registerProof(fuzzKey, fuzzNonce, fuzzPeer, m.Rank))
		inRange := m.Rank >= 0 && m.Rank < size
		_ = ok && inRange
		_ = tableItem{Rank: m.Rank, ID: fuzzPeer, Addrs: m.Addrs, HostID: m.HostID, Unix: m.Unix, TCPPort: m.TCPPort, TLSPort: m.TLSPort}
	})
}

// FuzzDecodeTable: a table from the (authenticated but possibly buggy)
// rendezvous is validated without panics; accepted tables are complete.
func FuzzDecodeTable(f *testing.F) {
	for _, s := range seedMessages(f) {
		f.Add(s[4:], 1, 0)
	}
	self, _ := peer.Decode(fuzzPeer)
	f.Fuzz(func(t *testing.T, data []byte, size, rank int) {
		m, err := decodeMsg(data)
		if err != nil || m.T != tTable {
			return
		}
		peers, err := parseTable(m.Table, size, rank, self)
		if err != nil {
			return
		}
		if len(peers) != size {
			t.Fatalf("accepted table of %d for size %d", len(peers), size)
		}
		for i, p := range peers {
			if p.Rank != i || p.ID == "" {
				t.Fatalf("bad entry %d: %+v", i, p)
			}
		}
		if rank >= 0 && rank < size && peers[rank].ID != self {
			t.Fatal("accepted table without self")
		}
	})
}

// FuzzDecodeDataHello: the data-link acceptor's checks never panic and only
// accept the designated dialer (the lower rank) of a link, in either
// direction, between it and the acceptor.
func FuzzDecodeDataHello(f *testing.F) {
	for _, s := range seedMessages(f) {
		f.Add(s[4:], 1, 2)
	}
	f.Fuzz(func(t *testing.T, data []byte, me, size int) {
		m, err := decodeMsg(data)
		if err != nil || m.T != tDHello {
			return
		}
		_ = bytes.Equal(m.Proof, dataProof(fuzzKey, fuzzNonce, m.Rank, m.Link, 0))
		if err := checkDataHello(m, me, size); err != nil {
			return
		}
		if m.Rank == me || m.Rank < 0 || m.Rank >= size || me < 0 || me >= size ||
			m.Rank > me || (m.Link != m.Rank && m.Link != me) {
			t.Fatalf("accepted bad hello %+v for me=%d size=%d", m, me, size)
		}
	})
}
