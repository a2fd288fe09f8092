package etcdlog

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// FindLeader returns the id and address of the replica that leads job's
// membership, waiting (until ctx ends) while none does: a process that
// joins needs only the etcd endpoints (tlsCfg: how to reach them, nil
// for plain TCP) and the job's rendezvous id.
func FindLeader(ctx context.Context, endpoints []string, tlsCfg *tls.Config, job string) (uint64, string, error) {
	where := strings.Join(endpoints, ",")
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, "", fmt.Errorf("etcd at %s: %w", where, err)
	}
	defer client.Close()
	key := "/gorun/" + job + "/leader/"
	var last error
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		resp, err := client.Get(ctx, key, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		switch {
		case err != nil:
			last = err
		case len(resp.Kvs) == 1:
			idText, addr, _ := strings.Cut(string(resp.Kvs[0].Value), " ")
			id, err := strconv.ParseUint(idText, 10, 64)
			if err != nil || addr == "" {
				return 0, "", fmt.Errorf("etcd at %s: bad election value %q under %s", where, resp.Kvs[0].Value, key)
			}
			return id, addr, nil
		default:
			last = fmt.Errorf("no replica of rendezvous %q leads yet", job)
		}
		if !sleep(ctx, delay) {
			if why := tlsProblem(endpoints, tlsCfg); why != nil {
				last = why
			}
			return 0, "", fmt.Errorf("etcd at %s: no leader of rendezvous %q found: %w (last: %v)", where, job, context.Cause(ctx), last)
		}
	}
}
