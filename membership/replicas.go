package membership

import (
	"cmp"
	"slices"
)

// The replicas of a replicated rendezvous that the job's processes host
// (Info.Replica): the log says which process hosts which replica, so any
// leader knows, from the membership alone, the replicas that went with
// their process (to take out of the group) and those that can take their
// place.

// HostedReplica is a replica of the rendezvous group that a process hosts.
type HostedReplica struct {
	ID   uint64
	Addr string // where the other replicas reach it
	Host string // its process' HostID
	// Spare: it takes the place of a lost replica rather than complete
	// the group at the start.
	Spare bool
	// Live: its process is in the job (registered before the start, a
	// member, or a joiner that waits to be admitted).
	Live bool
	// Gone: its process was lost, dropped or left: its replica went with
	// it, or will not serve the job any more.
	Gone bool
}

// HostedReplicas returns the replicas the processes host, ordered by id.
func (m *Machine) HostedReplicas() []HostedReplica {
	var out []HostedReplica
	for _, p := range m.procs {
		if p.info.Replica == 0 {
			continue
		}
		gone := p.gone || p.left || p.departed || p.removed
		live := !gone && (p.member || p.joiner || !m.el.tableSent)
		out = append(out, HostedReplica{ID: p.info.Replica, Addr: p.info.ReplicaAddr, Host: p.info.Host, Live: live, Gone: gone, Spare: p.info.ReplicaSpare})
	}
	slices.SortFunc(out, func(a, b HostedReplica) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
