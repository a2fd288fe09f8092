package membership

import (
	"reflect"
	"testing"
)

// The replicas the processes host, as any leader reads them from the
// log: live before the start and while members, gone with their process;
// a spare says so.
func TestHostedReplicas(t *testing.T) {
	j := newJob(t, Config{Size: 3, Elastic: true})
	hb := j.m.cfg.Heartbeat.Milliseconds()
	reg := func(id ID, replica uint64, spare bool) {
		in := info(id)
		in.Replica, in.ReplicaAddr, in.ReplicaSpare = replica, "10.0.0.9:1", spare
		j.step(Register{ID: id, Rank: int(id) - 1, Heartbeat: hb, Args: []string{"--epochs", "3"}, Info: in})
	}
	reg(1, 1, false)
	reg(2, 3, false)
	want := []HostedReplica{
		{ID: 1, Addr: "10.0.0.9:1", Host: "host1/boot", Live: true},
		{ID: 3, Addr: "10.0.0.9:1", Host: "host2/boot", Live: true},
	}
	if got := j.m.HostedReplicas(); !reflect.DeepEqual(got, want) {
		t.Fatalf("before the start: %+v, want %+v", got, want)
	}
	reg(3, 4, true)
	for id := ID(1); id <= 3; id++ {
		j.step(Ack{ID: id})
	}
	j.step(Disconnected{ID: 2, Err: "EOF"})
	want = []HostedReplica{
		{ID: 1, Addr: "10.0.0.9:1", Host: "host1/boot", Live: true},
		{ID: 3, Addr: "10.0.0.9:1", Host: "host2/boot", Gone: true},
		{ID: 4, Addr: "10.0.0.9:1", Host: "host3/boot", Live: true, Spare: true},
	}
	if got := j.m.HostedReplicas(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after rank 1's loss: %+v, want %+v", got, want)
	}
}
