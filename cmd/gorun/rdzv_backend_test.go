package main

import (
	"bytes"
	"strings"
	"testing"
)

// A bad --rdzv-* flag fails gorun before it starts anything, naming the
// flag and what to write.
func TestEtcdRdzvFlagsChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "zk", "true"}, `--rdzv-backend "zk": want gorun (gorun's rendezvous, the default) or etcd`},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "etcd", "true"}, "--rdzv-backend etcd needs --rdzv-endpoints"},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379,h2", "true"}, `--rdzv-endpoints "h1:2379,h2": "h2" is not host:port (write h1:2379,h2:2379,h3:2379)`},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "etcd", "--rdzv-endpoints", "http://h1:2379,https://h2:2379", "true"}, "http://h1:2379 and https://h2:2379: every address https://, or none"},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379", "--rdzv-conf", "cacert=/nonexistent/ca.pem", "true"}, `--rdzv-conf "cacert=/nonexistent/ca.pem": etcd's CA certificate: open /nonexistent/ca.pem: no such file or directory`},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379", "--rdzv-conf", "cert=c.pem", "true"}, "a client certificate for etcd needs both its cert and its key"},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379", "--rdzv-conf", "protocol=quic", "true"}, "protocol=quic: want http or https"},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-conf", "protocol=https", "true"}, "--rdzv-conf applies to --rdzv-backend etcd only"},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379", "--rdzv-id", "a/b", "true"}, `--rdzv-id: rendezvous id "a/b"`},
		{[]string{"-np", "2", "--min-np", "1", "--rdzv-endpoints", "h1:2379", "true"}, "--rdzv-endpoints applies to --rdzv-backend etcd only"},
		{[]string{"-np", "2", "--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379", "true"}, "--rdzv-backend applies to elastic jobs only"},
		{[]string{"-np", "2", "--min-np", "1", "--heartbeat-timeout", "1s", "--rdzv-backend", "etcd", "--rdzv-endpoints", "h1:2379", "true"}, "--rdzv-backend etcd needs --heartbeat-timeout 2s or more, got 1s"},
	} {
		root := newGorunCmd()
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(horovodArgs(c.args))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("gorun %q: %v; want an error with %q", c.args, err, c.want)
		}
	}
	out := gorunOutput(t, "help", "elastic")
	for _, want := range []string{"--rdzv-backend etcd --rdzv-endpoints", "etcdctl", "GORUN_RDZV_ENDPOINTS"} {
		if !strings.Contains(out, want) {
			t.Errorf("gorun help elastic lacks %q", want)
		}
	}
}
