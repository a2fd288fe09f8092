package collective

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/p2p"
)

// How a pod of an elastic job on Kubernetes starts (env_kubernetes_elastic.go):
// as a member of the job's first start, or, replaced after a loss, as a
// joiner of the running job. Nothing in a pod's environment tells the two
// apart: a container restarted by the kubelet, or a pod recreated by the
// operator, gets the same variables as the first. So:
//
//   - Pods 1 to 4 host their replica (1 and 2 the group's, 3 and 4
//     spares) on a port of their own and, once registered with the group
//     (the job's first start), relay the group's port on their pod to it
//     (replicaRelay): a replica is found at a pod's name only once that
//     pod is a member of a running group.
//   - Pod 0 first dials the group's port on pods 1 to 4
//     (podGroupRunning). If one answers, a group runs, started by an
//     earlier pod 0: this one comes back as a joiner, and does not start
//     a replica 1 of its own (a second group: split brain). If none
//     answers, this is the first start (those pods cannot have registered
//     without a replica 1), or the group lost every pod that hosted a
//     replica, and with them its majority, so it can not run either: pod
//     0 starts replica 1.
//   - Every other pod registers with its index, and if the group refuses
//     it because the job runs already, registers again as a joiner. If it
//     is refused because its index is registered (its previous container,
//     before the job started, not yet counted as lost), it asks again.
//
// At the first start pod 0 may start after the others, or before: they
// retry their registration until it hosts replica 1, and their relays
// open only after it, so pod 0 never takes the first start for a
// replacement. A pod 0 lost before the job's first epoch leaves relays
// behind on the others that point at a group which never started: the
// next pod 0 joins it, and the members registered with it fail at their
// timeout and are restarted (restartPolicy: OnFailure), which starts the
// job afresh.

// podProbeTimeout bounds pod 0's dial of another pod's replica port: a
// pod that is up answers (or refuses) within a round trip; one that is
// not is not a member of a running group.
const podProbeTimeout = 2 * time.Second

// podGroupRunning says whether a replica listens at the group's port on
// pods 1 to 4: whether a group started by an earlier pod 0 runs.
func podGroupRunning(ctx context.Context, pods *podGroup, size int) bool {
	ctx, cancel := context.WithTimeout(ctx, podProbeTimeout)
	defer cancel()
	answered := make(chan bool, podReplicas)
	n := 0
	for i := 1; i < podReplicas && i < size; i++ {
		n++
		go func() {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", pods.addr(i))
			if err == nil {
				conn.Close()
			}
			answered <- err == nil
		}()
	}
	running := false
	for range n {
		running = <-answered || running
	}
	return running
}

// podRendezvous is where pod self registers, unless it hosts replica 1:
// the replicas on pods 0 to 4 (ID@host:port; replica 1 without its ID),
// tried in turn, except its own pod's, which is not the group's (a
// replaced pod hosts none). At the first start pod 0's replica 1 takes the
// registrations; once pod 0 is lost, the others' replicas redirect to
// the leader.
func podRendezvous(pods *podGroup, size, self int) string {
	var list []string
	for i := 0; i < podReplicas && i < size; i++ {
		switch {
		case i == self:
		case i == 0:
			list = append(list, pods.addr(0))
		default:
			list = append(list, strconv.FormatUint(p2p.ReplicaID(i), 10)+"@"+pods.addr(i))
		}
	}
	return strings.Join(list, ",")
}

// registrationClosed says whether the group refused a registration because
// the job runs already (membership.Machine's refusal; the rank gets it
// only as text): the pod was replaced and joins as a joiner.
func registrationClosed(err error) bool {
	return err != nil && strings.Contains(err.Error(), "registration closed: the job runs")
}

// rankTaken says whether the group refused a registration because another
// process holds the pod's rank before the job started: the pod's previous
// container, whose loss the group has not noticed yet (within the
// heartbeat bound), after which the rank is free again.
func rankTaken(err error) bool {
	return err != nil && strings.Contains(err.Error(), " already registered from ")
}

// waitRetry waits before asking the group again (d), or until ctx ends.
func waitRetry(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// joinAsPod joins the job as a pod of it (the member of its index, or a
// joiner once the group says the job runs without it), with join, which
// joins at a rendezvous address. Pods 1 to 4 then relay the group's port
// to their replica. cfg and who change with a pod that becomes a joiner.
func (c *Comm) joinAsPod(ctx, setup context.Context, cfg *config, who *string, join func(context.Context, config, string) (*p2p.Node, error)) error {
	rendezvous := cfg.rendezvous // pod 0, or a replaced pod 0 (podJoiner)
	if cfg.rank > 0 {
		rendezvous = podRendezvous(cfg.pods, cfg.size, cfg.rank)
	}
	// Pod 0 hosts replica 1 (a replaced one joins already): no other
	// process can hold its rank.
	err := c.joinOrRejoin(ctx, setup, cfg, who, cfg.rank > 0, rendezvous, join, podJoiner)
	if err == nil && c.replica != nil {
		if c.relay, err = startReplicaRelay(cfg.pods.port, c.replica.Addr()); err != nil {
			err = fmt.Errorf("relaying the rendezvous group's port %d to this pod's replica: %w", cfg.pods.port, err)
		}
	}
	return err
}

// joinOrRejoin joins the job at rendezvous with join as the member of
// cfg's rank, or, if the job runs already (this process replaces one
// that was lost: a container restarted by the kubelet, a pod recreated
// by the operator), as a joiner (asJoiner's cfg), waiting as long as the
// job runs without it. Nothing in a replacement's environment tells it
// from the first start's process, so the rendezvous says. If restartable,
// a registration refused because the rank is registered (the previous
// process, whose loss the rendezvous has not noticed yet, within the
// heartbeat bound) is asked again within setup. A joiner stands for no
// replica: its rank's replica id may still be the lost process's.
func (c *Comm) joinOrRejoin(ctx, setup context.Context, cfg *config, who *string, restartable bool, rendezvous string,
	join func(context.Context, config, string) (*p2p.Node, error), asJoiner func(config, int) config) error {
	var err error
	c.node, err = join(setup, *cfg, rendezvous)
	for restartable && rankTaken(err) {
		if werr := waitRetry(setup, c.heartbeat/4); werr != nil {
			break
		}
		c.node, err = join(setup, *cfg, rendezvous)
	}
	if !restartable || !registrationClosed(err) {
		return err
	}
	if c.replica != nil {
		c.replica.CloseNow()
		c.replica = nil
	}
	self := cfg.rank
	*cfg = asJoiner(*cfg, self)
	c.joiner = true
	*who = fmt.Sprintf("joiner (in place of rank %d)", self)
	if cfg.pods != nil {
		*who = fmt.Sprintf("joiner (replaced pod %d)", self)
	}
	c.node, err = join(ctx, *cfg, cfg.rendezvous)
	return err
}

// etcdJoiner is cfg for a process of a job kept in etcd that comes back as
// a joiner: the rendezvous stays the leader found in etcd.
func etcdJoiner(cfg config, _ int) config {
	cfg.rank, cfg.replica = -1, false
	return cfg
}

// podJoiner is cfg for pod self coming back as a joiner: no replica, the
// rendezvous found through the group's replicas on the other pods.
func podJoiner(cfg config, self int) config {
	cfg.rendezvous = podRendezvous(cfg.pods, cfg.size, self)
	cfg.rank, cfg.hostRendezvous, cfg.group, cfg.replica = -1, false, false, false
	return cfg
}
