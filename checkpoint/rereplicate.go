package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/gorun/gorun/collective"
)

// rereplicate writes the files of a restored step that have fewer copies
// than the replication factor asks for to domains that lack them, from
// memory: shards from the restored tensors, blob files from the broadcast.
// Each file goes first to its owner's domain, then to the domains after
// it, so the layout a save of this job size makes comes back. The
// manifest follows the files in every domain that received any, and goes
// to a domain that lost only it; it is written once every rank knows which
// domains' file writes succeeded, and names as holders of a file only the
// domains whose copy is verified (read by this restore, or written here).
// A failure here is logged, not returned: the restore itself succeeded.
func (m *Manager) rereplicate(ctx context.Context, st *State, dom *domains, man *Manifest, files []FileInfo, holders [][]int, blobData [][]byte) error {
	rank, n, h := m.comm.Rank(), m.comm.Size(), dom.h()
	want := min(m.replicaCount(dom)+1, h)
	nf := len(files)
	type job struct{ file, dom int }
	var jobs []job
	targets := map[int]bool{}
	for i := range nf {
		in := map[int]bool{}
		for _, r := range holders[i] {
			in[dom.of[r]] = true
		}
		if len(in) >= want {
			continue
		}
		start := dom.of[holders[i][0]]
		if o := i % man.WorldSize; o < n {
			start = dom.of[o]
		}
		for j := 0; j < h && len(in) < want; j++ {
			d := (start + j) % h
			if !in[d] {
				in[d] = true
				jobs = append(jobs, job{i, d})
				targets[d] = true
			}
		}
	}
	hasMan := map[int]bool{}
	for _, r := range holders[nf] {
		hasMan[dom.of[r]] = true
	}
	// A domain that holds every file a save of this size puts there but
	// lost only the manifest (a crash between the files and the commit
	// there) gets the manifest back too.
	if man.WorldSize == n {
		k := m.replicaCount(dom)
		complete := map[int]bool{}
		for d := range h {
			complete[d] = !hasMan[d]
		}
		for i := range nf {
			in := map[int]bool{}
			for _, r := range holders[i] {
				in[dom.of[r]] = true
			}
			for _, j := range jobs {
				if j.file == i {
					in[j.dom] = true
				}
			}
			for _, d := range dom.homes(i%n, k) {
				if !in[d] {
					complete[d] = false
				}
			}
		}
		for d, ok := range complete {
			if ok {
				targets[d] = true
			}
		}
	}
	if len(targets) == 0 {
		return nil
	}
	// The files first, in every domain that lacks some; then every rank
	// learns which domains wrote theirs, and only then the manifests are
	// written, each recording as holders only the verified copies: those
	// read above and those just written.
	var werr error
	lead := dom.leads(rank) && targets[dom.of[rank]]
	if lead {
		for _, j := range jobs {
			if j.dom != dom.of[rank] || werr != nil {
				continue
			}
			f := files[j.file]
			var chunks [][]byte
			if j.file < len(man.Shards) {
				chunks = st.slice(f.Offset, f.Offset+f.Size)
			} else {
				chunks = [][]byte{blobData[j.file-len(man.Shards)]}
			}
			hs := sha256.New()
			for _, c := range chunks {
				hs.Write(c)
			}
			if sum := hex.EncodeToString(hs.Sum(nil)); sum != f.SHA256 {
				werr = fmt.Errorf("%s: the restored bytes have sha256 %s, the manifest says %s", f.File, short(sum), short(f.SHA256))
				break
			}
			if err := m.store.Put(ctx, stepKey(man.Step)+"/"+f.File, chunks...); err != nil {
				werr = objectErr(m.StepLocation(man.Step)+"/"+f.File, err)
			}
		}
		if werr != nil {
			m.logf("checkpoint: WARNING: rank %d: step %d: re-replicating: %v", rank, man.Step, werr)
		}
	}
	fileFlags := make([]byte, n)
	if err := m.comm.Allgather(ctx, []byte{byte(boolU64(werr != nil))}, fileFlags, collective.Name("checkpoint.restore.rereplicate.files")); err != nil {
		return err
	}
	wrote := func(d int) bool { return fileFlags[dom.members[d][0]] == 0 }
	var merr error
	if lead && werr == nil {
		// The manifest says where the files are now, in this job's
		// numbering of the domains, and that this copy is here.
		nm := *man
		nm.Hosts, nm.Replicas, nm.Host = h, want-1, dom.of[rank]
		nm.Shards, nm.Blobs = slices.Clone(man.Shards), slices.Clone(man.Blobs)
		for i := range nf {
			at := map[int]bool{}
			for _, r := range holders[i] {
				at[dom.of[r]] = true
			}
			for _, j := range jobs {
				if j.file == i && wrote(j.dom) {
					at[j.dom] = true
				}
			}
			hs := slices.Sorted(maps.Keys(at))
			if i < len(nm.Shards) {
				nm.Shards[i].Hosts = hs
			} else {
				nm.Blobs[i-len(nm.Shards)].Hosts = hs
			}
		}
		var data []byte
		if data, merr = json.MarshalIndent(&nm, "", "  "); merr == nil {
			if err := m.store.Put(ctx, stepKey(man.Step)+"/"+ManifestName, append(data, '\n')); err != nil {
				merr = objectErr(m.StepLocation(man.Step)+"/"+ManifestName, err)
			}
		}
		if merr != nil {
			m.logf("checkpoint: WARNING: rank %d: step %d: re-replicating: %v", rank, man.Step, merr)
		}
	}
	flags := make([]byte, n)
	if err := m.comm.Allgather(ctx, []byte{byte(boolU64(werr != nil || merr != nil))}, flags, collective.Name("checkpoint.restore.rereplicate")); err != nil {
		return err
	}
	if rank == 0 {
		var doms []int
		files := 0
		for _, j := range jobs {
			if flags[dom.members[j.dom][0]] == 0 {
				files++
			}
		}
		for _, d := range slices.Sorted(maps.Keys(targets)) {
			if flags[dom.members[d][0]] == 0 {
				doms = append(doms, d)
			}
		}
		if len(doms) > 0 {
			m.logf("checkpoint: step %d: re-replicated %d file(s) to %s", man.Step, files, dom.dirList(doms))
		}
	}
	return nil
}
