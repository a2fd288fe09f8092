package checkpoint

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gorun/gorun/collective"
)

// proposal is what one rank brings to the agreement of a save (step 1 in
// the package documentation). Every rank allgathers every proposal and
// takes the same decision from them: fail (naming the ranks), skip the
// save, or go on with one plan.
type proposal struct {
	step      int64
	layout    [32]byte // State.layoutHash
	blobLen   int64    // the rank's blobs, encoded
	free      uint64   // bytes free in its store
	freeOK    bool     // free could be checked
	stateOK   bool     // its state could be encoded
	committed bool     // it leads its domain and sees step committed there
	good      bool     // step is the one its Manager restored or committed last
	storeOK   bool     // its store ended its previous work (makeWay)
	replicas  int64    // k (WithReplicas)
	margin    int64    // WithDiskMargin; -1: the default
}

// proposalLen is the size of an encoded proposal.
const proposalLen = 8 + 32 + 8 + 8 + 8 + 8 + 8 + 8 + 8

func (p *proposal) encode() []byte {
	b := make([]byte, 0, proposalLen)
	b = binary.LittleEndian.AppendUint64(b, uint64(p.step))
	b = append(b, p.layout[:]...)
	b = binary.LittleEndian.AppendUint64(b, uint64(p.blobLen))
	b = binary.LittleEndian.AppendUint64(b, p.free)
	b = binary.LittleEndian.AppendUint64(b, boolU64(p.freeOK))
	b = binary.LittleEndian.AppendUint64(b, boolU64(p.stateOK))
	b = binary.LittleEndian.AppendUint64(b, boolU64(p.committed)|boolU64(p.good)<<1|boolU64(p.storeOK)<<2)
	b = binary.LittleEndian.AppendUint64(b, uint64(p.replicas))
	return binary.LittleEndian.AppendUint64(b, uint64(p.margin))
}

func decodeProposal(b []byte) proposal {
	u := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	return proposal{
		step:      int64(u(0)),
		layout:    [32]byte(b[8:40]),
		blobLen:   int64(u(40)),
		free:      u(48),
		freeOK:    u(56) != 0,
		stateOK:   u(64) != 0,
		committed: u(72)&1 != 0,
		good:      u(72)&2 != 0,
		storeOK:   u(72)&4 != 0,
		replicas:  int64(u(80)),
		margin:    int64(u(88)),
	}
}

// ownProposal is this rank's proposal with what stays on this rank.
type ownProposal struct {
	proposal
	blobs    []byte // its blobs, encoded
	stateErr error  // why its state cannot be saved
	freeErr  error  // why its free space could not be checked
	storeErr error  // why its store could not end its previous work (makeWay)
}

// agree is step 1 of a save, on every rank: one allgather of the ranks'
// proposals (propose), from which every rank takes the same decision. It
// fails, on every rank, when a rank's store did not end its previous work
// (storeErr, from makeWay) or its state could not be encoded, the ranks
// disagree on the settings, the step or the registered state
// (checkAgreed), or a domain lacks the space (checkFreeSpace). It returns
// nil and nil when the step is already committed and is the one this job
// restored or saved last: the save is skipped. The allgather may wait for
// ranks that were waiting for their stores: it is bounded by the storage
// deadline plus the collective timeout.
func (m *Manager) agree(ctx context.Context, step int64, st *State, dom *domains, async bool, storeErr error) (*plan, error) {
	rank, n := m.comm.Rank(), m.comm.Size()
	own := m.propose(ctx, step, st, dom)
	own.storeErr, own.storeOK = storeErr, storeErr == nil
	all := make([]byte, proposalLen*n)
	if err := m.comm.Allgather(m.ioCtx(ctx), own.encode(), all, collective.Name("checkpoint.agree")); err != nil {
		return nil, failed(step, async, fmt.Errorf("agreeing on the step: %w", err))
	}
	props := make([]proposal, n)
	for r := range props {
		props[r] = decodeProposal(all[r*proposalLen:])
	}
	if err := m.checkAgreed(step, &own, props, async); err != nil {
		return nil, err
	}
	anyCommitted := slices.ContainsFunc(props, func(p proposal) bool { return p.committed })
	// A committed step that a member restored or committed (every member
	// but a joiner of an elastic job knows it: one knowing is enough).
	if anyCommitted && slices.ContainsFunc(props, func(p proposal) bool { return p.good }) {
		m.logf("checkpoint: step %d is already committed in %s; not saved again", step, m.dir)
		return nil, nil
	}
	if anyCommitted && rank == 0 {
		// Not the checkpoint this job restored or saved: a restore skipped
		// it as unloadable (or another run wrote it). The new save
		// replaces it; keeping it would leave the job unable to save this
		// step at all.
		m.logf("checkpoint: step %d is committed in %s, but it is not a checkpoint this job restored or saved; replacing it", step, m.dir)
	}
	blobLen := make([]int64, n)
	for r, p := range props {
		blobLen[r] = p.blobLen
	}
	p := newPlan(step, st, dom, int(own.replicas), blobLen, rank)
	if err := m.checkFreeSpace(p, &own, props, async); err != nil {
		return nil, err
	}
	p.blobs[rank] = own.blobs
	return p, nil
}

// propose is this rank's proposal. A rank whose state cannot be saved (a
// registration error, a blob's save func failing) still proposes, so that
// every rank fails together.
func (m *Manager) propose(ctx context.Context, step int64, st *State, dom *domains) ownProposal {
	own := ownProposal{stateErr: st.err}
	if own.stateErr == nil {
		own.blobs, own.stateErr = st.encodeBlobs()
	}
	// Whether step is already committed here: a restore returned it and
	// the loop saves it again. Its leads look (a save never replaces a
	// committed checkpoint).
	if dom.leads(m.comm.Rank()) && step >= 0 {
		sctx, cancel := m.storageCtx(ctx)
		if rc, _, err := m.store.Get(sctx, stepKey(step)+"/"+ManifestName); err == nil {
			rc.Close()
			own.committed = true
		}
		cancel()
	}
	own.free = 1 << 62 // a store that reports no free space has no limit to check
	if s, ok := m.store.(spaceReporter); ok {
		own.free, own.freeErr = s.freeSpace()
	}
	own.step = step
	own.layout = st.layoutHash()
	own.blobLen = int64(len(own.blobs))
	own.freeOK = own.freeErr == nil
	own.stateOK = own.stateErr == nil
	own.good = step == m.good
	own.replicas = int64(m.replicaCount(dom))
	own.margin = m.margin
	return own
}

// checkAgreed fails the save when a rank's store did not end its previous
// work, or a rank's state could not be encoded, or the ranks disagree on
// the replicas, the disk margin, the step or the registered state, or the
// step is negative. The error is the same on every rank but for the cause
// a failed rank names.
func (m *Manager) checkAgreed(step int64, own *ownProposal, props []proposal, async bool) error {
	rank := m.comm.Rank()
	var storeBad []int
	for r, p := range props {
		if !p.storeOK {
			storeBad = append(storeBad, r)
		}
	}
	if len(storeBad) > 0 {
		if own.storeErr != nil {
			m.logf("checkpoint: rank %d: step %d: %v", rank, step, own.storeErr)
			return failed(step, async, own.storeErr)
		}
		return failed(step, async, fmt.Errorf("the checkpoint store of %s at %s did not answer (see %s for the cause)", rankList(storeBad), m.dir, logsOf(storeBad)))
	}
	steps := map[int64][]int{}
	ks := map[int64][]int{}
	margins := map[int64][]int{}
	var layoutDiff, stateBad []int
	for r, p := range props {
		steps[p.step] = append(steps[p.step], r)
		ks[p.replicas] = append(ks[p.replicas], r)
		margins[p.margin] = append(margins[p.margin], r)
		if p.layout != own.layout {
			layoutDiff = append(layoutDiff, r)
		}
		if !p.stateOK {
			stateBad = append(stateBad, r)
		}
	}
	if len(stateBad) > 0 {
		if own.stateErr != nil {
			m.logf("checkpoint: rank %d: step %d: %v", rank, step, own.stateErr)
			cause := strings.TrimPrefix(own.stateErr.Error(), "checkpoint: ")
			if len(stateBad) == 1 {
				return failed(step, async, fmt.Errorf("rank %d could not save its state: %s", rank, cause))
			}
			return failed(step, async, fmt.Errorf("ranks %v could not save their state; this rank %d: %s", stateBad, rank, cause))
		}
		if len(stateBad) == 1 {
			return failed(step, async, fmt.Errorf("rank %d could not save its state (see its log for the cause)", stateBad[0]))
		}
		return failed(step, async, fmt.Errorf("ranks %v could not save their state (see their logs for the cause)", stateBad))
	}
	if len(ks) > 1 {
		return failed(step, async, fmt.Errorf("ranks disagree on the number of replicas (WithReplicas, %s): %s", EnvReplicas, rankGroups(ks, "")))
	}
	if len(margins) > 1 {
		return failed(step, async, fmt.Errorf("ranks disagree on the disk margin (WithDiskMargin): %s", rankGroups(margins, "bytes (-1: the default)")))
	}
	if len(steps) > 1 {
		var parts []string
		for _, s := range slices.Sorted(maps.Keys(steps)) {
			parts = append(parts, fmt.Sprintf("ranks %v at step %d", steps[s], s))
		}
		return failed(step, async, fmt.Errorf("ranks disagree on the step: %s", strings.Join(parts, ", ")))
	}
	if step < 0 {
		return fmt.Errorf("checkpoint: step %d is negative", step)
	}
	if len(layoutDiff) > 0 {
		return failed(step, async, fmt.Errorf("ranks %v registered different tensors or blobs than this rank %d (names, dtypes and shapes must match on every rank)", layoutDiff, rank))
	}
	return nil
}

// checkFreeSpace fails the save, before anything is written, when a rank
// could not check its free space, or when in some storage domain a rank
// sees less free space than the bytes that domain will keep plus the
// margin (WithDiskMargin, default 10%, at least 1 MiB).
func (m *Manager) checkFreeSpace(p *plan, own *ownProposal, props []proposal, async bool) error {
	var statfsBad []int
	for r, pr := range props {
		if !pr.freeOK {
			statfsBad = append(statfsBad, r)
		}
	}
	if len(statfsBad) > 0 {
		if own.freeErr != nil {
			return failed(p.step, async, fmt.Errorf("checking free space in %s: %w", m.dir, own.freeErr))
		}
		return failed(p.step, async, fmt.Errorf("ranks %v could not check free space in %s", statfsBad, m.dir))
	}
	needs := p.domainBytes()
	for d, mem := range p.dom.members {
		minFree, minRank := ^uint64(0), -1
		for _, r := range mem {
			if props[r].free < minFree {
				minFree, minRank = props[r].free, r
			}
		}
		margin := m.margin
		if margin < 0 {
			margin = max(needs[d]/10, 1<<20)
		}
		if uint64(needs[d]+margin) > minFree {
			// Every rank sees it; a restart would see it again.
			return failed(p.step, async, &recurring{"is full (not enough free space for a checkpoint)", fmt.Errorf("not enough disk space in %s: the checkpoint needs %s plus a margin of %s, but rank %d sees only %s free; nothing was written",
				m.dir, human(needs[d]), human(margin), minRank, human(int64(minFree)))})
		}
	}
	return nil
}

// agreeBusy is the agreement of a SaveAsync of step while a save is in
// flight: every rank says whether it skips a save while busy
// (WithSkipIfBusy) and whether it is still busy. With WithSkipIfBusy on
// every rank and any rank busy, the save is skipped (skip true) on every
// rank; ranks that disagree on WithSkipIfBusy fail, named.
func (m *Manager) agreeBusy(ctx context.Context, step int64) (skip bool, err error) {
	n := m.comm.Size()
	rec := []byte{byte(boolU64(m.skipIfBusy)), byte(boolU64(m.flight.busy()))}
	all := make([]byte, 2*n)
	// A rank may come from waiting for its store (makeWay).
	if err := m.comm.Allgather(m.ioCtx(ctx), rec, all, collective.Name("checkpoint.busy")); err != nil {
		return false, failed(step, true, fmt.Errorf("agreeing on the step: %w", err))
	}
	skips := map[int64][]int{}
	anyBusy := false
	for r := range n {
		skips[int64(all[2*r])] = append(skips[int64(all[2*r])], r)
		anyBusy = anyBusy || all[2*r+1] != 0
	}
	if len(skips) > 1 {
		return false, failed(step, true, fmt.Errorf("ranks disagree on WithSkipIfBusy: ranks %v skip a save while the previous one is busy, ranks %v wait for it", skips[1], skips[0]))
	}
	if !m.skipIfBusy || !anyBusy {
		return false, nil
	}
	doing := "written"
	if m.flight.committing {
		doing = "committed"
	}
	m.logf("checkpoint: step %d: skipped: the save of step %d is still being %s (WithSkipIfBusy)", step, m.flight.p.step, doing)
	return true, nil
}

// rankList names ranks: "rank 2", "ranks [0 2]".
func rankList(ranks []int) string {
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d", ranks[0])
	}
	return fmt.Sprintf("ranks %v", ranks)
}

// logsOf says whose log has the cause: "its log", "their logs".
func logsOf(ranks []int) string {
	if len(ranks) == 1 {
		return "its log"
	}
	return "their logs"
}

// rankGroups says which ranks hold which value: "ranks [0 2] 1, ranks [1] 2".
func rankGroups(byValue map[int64][]int, unit string) string {
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(byValue)) {
		part := fmt.Sprintf("ranks %v: %d", byValue[v], v)
		if unit != "" {
			part += " " + unit
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}
