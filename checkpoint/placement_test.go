package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/collective"
)

// Three hosts, one rank each, one replica: every host's manifest says
// which host it is and where every file is, Scan checks the files that
// host keeps, and a file missing or damaged there is DEGRADED (another
// host keeps it), not corrupted; a restore heals it.
func TestReplicatedPerHostView(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 1, 2)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 40, same(4), WithReplicas(1)))
	for d, h := range hosts {
		man, err := readManifest(StepDir(h, 40))
		if err != nil {
			t.Fatal(err)
		}
		if man.Hosts != 3 || man.Replicas != 1 || man.Host != d {
			t.Errorf("%s: manifest says hosts %d replicas %d host %d, want 3 1 %d", h, man.Hosts, man.Replicas, man.Host, d)
		}
		for _, f := range man.Files() {
			if want := []int{f.Rank, (f.Rank + 1) % 3}; !slices.Equal(f.Hosts, slices.Sorted(slices.Values(want))) {
				t.Errorf("%s: %s is placed on %v, want %v", h, f.File, f.Hosts, want)
			}
			if got := slices.Contains(files(t, h, 40), f.File); got != man.Holds(f) {
				t.Errorf("%s: %s is there: %v, Holds says %v", h, f.File, got, man.Holds(f))
			}
		}
		if n, b := man.Here(); n != 4 || b <= 0 || b >= man.Size() {
			t.Errorf("%s: Here() = %d files, %d bytes (of %d)", h, n, b, man.Size())
		}
		if p := man.Placement(); p != fmt.Sprintf("host %d of 3; each file is on 2 hosts", d) {
			t.Errorf("%s: Placement() = %q", h, p)
		}
		r, err := Scan(h)
		if err != nil || r.Pick != 40 || r.Entries[0].Problem != "" || r.Entries[0].Degraded != "" {
			t.Fatalf("Scan(%s): %+v %v", h, r, err)
		}
	}
	// Host 1 keeps the files of ranks 0 and 1: lose rank 1's shard, damage
	// rank 0's blob file.
	if err := os.Remove(filepath.Join(StepDir(hosts[1], 40), shardName(1, 3))); err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(StepDir(hosts[1], 40), blobName(0))
	if err := os.WriteFile(blob, []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Given its directory alone, Scan cannot check the other copies, and
	// says so.
	r, err := Scan(hosts[1])
	if err != nil || r.Pick != 40 || r.Entries[0].Problem != "" {
		t.Fatalf("Scan of the damaged host: %+v %v", r, err)
	}
	want := "shard-00001-of-00003.bin is missing here (host 2 should keep another copy: not checked); rank-00000.state is 4 bytes, manifest says "
	if d := r.Entries[0].Degraded; !strings.HasPrefix(d, want) || !strings.HasSuffix(d, "(truncated or overwritten) (host 0 should keep another copy: not checked); the next restore reads them from another host and writes them back here") {
		t.Errorf("Degraded = %q, want it to start %q", d, want)
	}
	if !strings.Contains(r.Reason, "the copies on hosts 0 and 2 were not checked (give the location with {host}") {
		t.Errorf("Reason = %q", r.Reason)
	}
	// Given with {host}, it checks them beside it.
	t.Setenv(EnvHost, "host1")
	r, err = Scan(filepath.Join(filepath.Dir(hosts[1]), "{host}"))
	if err != nil || r.Pick != 40 || r.Entries[0].Problem != "" || r.Entries[0].Unchecked != "" {
		t.Fatalf("Scan of {host} as host 1: %+v %v", r, err)
	}
	want = "shard-00001-of-00003.bin is missing here (its copy in " + hosts[2] + " verifies); rank-00000.state is 4 bytes, manifest says "
	if d := r.Entries[0].Degraded; !strings.HasPrefix(d, want) || !strings.HasSuffix(d, "(truncated or overwritten) (its copy in "+hosts[0]+" verifies); the next restore reads them from another host and writes them back here") {
		t.Errorf("Degraded = %q, want it to start %q", d, want)
	}
	if !strings.HasSuffix(r.Reason, "whose copies on other hosts verify: a restore reads them from there") {
		t.Errorf("Reason = %q", r.Reason)
	}
	// The other hosts are fine.
	for _, h := range []string{hosts[0], hosts[2]} {
		if r, err := Scan(h); err != nil || r.Entries[0].Degraded != "" || r.Entries[0].Problem != "" {
			t.Errorf("Scan(%s): %+v %v", h, r, err)
		}
	}
	var lb logBuf
	restoreDirs(t, comms, dirs, 40, 4, WithReplicas(1), WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "re-replicated 2 file(s) to the checkpoint directory "+dirLabel(hosts[1])+"\n") {
		t.Errorf("log:\n%s", lb.String())
	}
	if r, err := Scan(hosts[1]); err != nil || r.Entries[0].Degraded != "" || r.Entries[0].Problem != "" {
		t.Errorf("Scan of the healed host: %+v %v", r, err)
	}
	// A lost directory comes back with a manifest of its own.
	os.RemoveAll(hosts[2])
	restoreDirs(t, comms, dirs, 40, 4, WithReplicas(1))
	man, err := readManifest(StepDir(hosts[2], 40))
	if err != nil || man.Host != 2 || man.Hosts != 3 {
		t.Fatalf("re-replicated manifest of host 2: %+v %v", man, err)
	}
	if r, err := Scan(hosts[2]); err != nil || r.Entries[0].Degraded != "" || r.Entries[0].Problem != "" {
		t.Errorf("Scan of the re-replicated host: %+v %v", r, err)
	}
	checkHolds(t, hosts[2], 40, 1, 2)
	// Bit rot (same size) is seen only by reading: Scan says what to do.
	corruptShard(t, hosts[0], 40, 2, "flip")
	r, err = Scan(hosts[0])
	if d := r.Entries[0].Degraded; err != nil || r.Pick != 40 || !strings.HasPrefix(d, "shard-00002-of-00003.bin has sha256 ") ||
		!strings.HasSuffix(d, "(bit rot or a torn write) (host 2 should keep another copy: not checked); a restore uses another host's copy (remove this one, and the next restore writes it back here)") {
		t.Errorf("Scan with a flipped bit: %+v %v", r, err)
	}
	restoreDirs(t, comms, dirs, 40, 4, WithReplicas(1))
}

// A shard lost on both hosts that keep it (3 hosts, one replica): Scan of
// any host's directory given with {host} checks the other hosts' copies
// and finds none left, so it says the step is corrupted and picks the
// previous one, as the restore does; given one directory alone, it does
// not take the other copy as good from the manifest, but says it is not
// checked.
func TestScanChecksOtherHostsCopies(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 1, 2)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 10, same(1), WithReplicas(1)))
	mustAll(t, saveDirs(comms, dirs, 20, same(2), WithReplicas(1)))
	for _, h := range []string{hosts[1], hosts[2]} {
		if err := os.Remove(filepath.Join(StepDir(h, 20), shardName(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	loc := filepath.Join(filepath.Dir(hosts[0]), "{host}")
	for host, want := range map[string]string{
		"host1": "corrupted: no intact copy of shard-00001-of-00003.bin is left (missing here; missing in " + hosts[2] + ")",
		"host0": "corrupted: no intact copy of shard-00001-of-00003.bin is left (missing in " + hosts[1] + "; missing in " + hosts[2] + ")",
	} {
		t.Setenv(EnvHost, host)
		r, err := Scan(loc)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Scan as %s: step 20: %s; %s", host, r.Entries[0].Problem, r.Reason)
		if r.Entries[0].Problem != want || r.Pick != 10 || !strings.HasPrefix(r.Reason, "step 10 is the newest committed checkpoint that verifies (skipped: step 20 corrupted: no intact copy of ") {
			t.Errorf("Scan as %s: step 20 %q, pick %d: %s; want %q and step 10", host, r.Entries[0].Problem, r.Pick, r.Reason, want)
		}
	}
	r, err := Scan(hosts[1])
	if err != nil || r.Pick != 20 || !strings.Contains(r.Entries[0].Degraded, "shard-00001-of-00003.bin is missing here (host 2 should keep another copy: not checked)") ||
		!strings.Contains(r.Reason, "the copies on hosts 0 and 2 were not checked") {
		t.Errorf("Scan of host 1's directory alone: %+v %v", r, err)
	}
	var lb logBuf
	restoreDirs(t, comms, dirs, 10, 1, WithReplicas(1), WithLogger(lb.logf))
	if !strings.Contains(lb.String(), "skipping the checkpoint of step 20") {
		t.Errorf("the restore did not skip step 20:\n%s", lb.String())
	}
}

// Without replicas a file missing from its only host is corruption.
func TestReplicatedNoReplicaMissingIsCorrupt(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 1, 2)
	comms := newJob(t, 3)
	mustAll(t, saveDirs(comms, dirs, 1, same(1), WithReplicas(0)))
	if got := files(t, hosts[2], 1); len(got) != 3 {
		t.Fatalf("%s holds %v", hosts[2], got)
	}
	if err := os.Remove(filepath.Join(StepDir(hosts[2], 1), blobName(2))); err != nil {
		t.Fatal(err)
	}
	r, err := Scan(hosts[2])
	if err != nil || r.Pick != -1 || r.Entries[0].Problem != "corrupted: rank-00002.state is missing" {
		t.Errorf("Scan: %+v %v", r, err)
	}
}

// Manifests without the placement fields (written before they existed)
// still restore, and mean "every file is here".
func TestOldManifestWithoutPlacement(t *testing.T) {
	dirs, hosts := hostDirs(t, 0, 0, 1, 1)
	comms := newJob(t, 4)
	mustAll(t, saveDirs(comms, dirs, 3, same(3)))
	for _, h := range hosts {
		p := filepath.Join(StepDir(h, 3), ManifestName)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var raw map[string]any
		if err := json.Unmarshal(data, &raw); err != nil {
			t.Fatal(err)
		}
		delete(raw, "hosts")
		delete(raw, "replicas")
		delete(raw, "host")
		for _, k := range []string{"shards", "blobs"} {
			for _, f := range raw[k].([]any) {
				delete(f.(map[string]any), "hosts")
			}
		}
		data, _ = json.Marshal(raw)
		if strings.Contains(string(data), "host") {
			t.Fatalf("placement left in %s", data)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if r, err := Scan(h); err != nil || r.Pick != 3 || r.Entries[0].Manifest.Replicated() {
			t.Fatalf("Scan(%s): %+v %v", h, r, err)
		}
	}
	restoreDirs(t, comms, dirs, 3, 3)
	// Into another size too, and with the per-host view of a single
	// directory (two hosts, two copies: every file is everywhere).
	restoreDirs(t, newJob(t, 1), dirs[:1], 3, 3)
}

// "{host}" is expanded by every function that takes a location, the same
// way; in an s3:// location it is refused.
func TestExpandHostEverywhere(t *testing.T) {
	base := t.TempDir()
	t.Setenv(EnvHost, "node3")
	loc := filepath.Join(base, "{host}")
	mustAll(t, save(t, newJob(t, 2), loc, 5, 5))
	if _, err := os.Stat(filepath.Join(StepDir(filepath.Join(base, "node3"), 5), ManifestName)); err != nil {
		t.Fatal(err)
	}
	if got, err := ExpandHost(loc); err != nil || got != filepath.Join(base, "node3") {
		t.Errorf("ExpandHost = %q, %v", got, err)
	}
	if r, err := Scan(loc); err != nil || r.Pick != 5 {
		t.Errorf("Scan: %+v %v", r, err)
	}
	if es, err := List(context.Background(), loc); err != nil || len(es) != 1 || es[0].Manifest == nil || es[0].Dir != StepDir(filepath.Join(base, "node3"), 5) {
		t.Errorf("List: %+v %v", es, err)
	}
	s, err := OpenStore(context.Background(), loc)
	if err != nil || s.String() != filepath.Join(base, "node3") {
		t.Errorf("OpenStore: %v %v", s, err)
	}
	if err := Remove(context.Background(), loc, 6); err == nil || !strings.Contains(err.Error(), "no step 6 in "+filepath.Join(base, "node3")+" (steps there: 5)") {
		t.Errorf("Remove of a missing step: %v", err)
	}
	if err := Remove(context.Background(), loc, 5); err != nil {
		t.Errorf("Remove: %v", err)
	}
	if _, err := ExpandHost("s3://b/{host}"); err == nil || !strings.Contains(err.Error(), "every host shares") {
		t.Errorf("ExpandHost of s3: %v", err)
	}
	if _, err := New(newJob(t, 1)[0], "s3://b/{host}"); err == nil {
		t.Error("New accepted {host} in an s3:// location")
	}
}

// A failed write during Save says the location, the file and the cause,
// each once.
func TestSaveWriteErrorSaysFileOnce(t *testing.T) {
	dir := t.TempDir()
	comms := newJob(t, 3)
	mustAll(t, save(t, comms, dir, 1, 1))
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 1 {
			// Rank 1 has written its shard; its blob file's temporary
			// name is taken by a directory.
			return os.Mkdir(filepath.Join(StepDir(dir, 2), blobName(1)+".tmp"), 0o755)
		}
		return nil
	}
	errs := save(t, comms, dir, 2, 2)
	testHook = nil
	want := "checkpoint: step 2: " + filepath.Join(StepDir(dir, 2), blobName(1)) + ": open: is a directory (previous checkpoint kept)"
	if errs[1] == nil || errs[1].Error() != want {
		t.Errorf("rank 1: %v\nwant %s", errs[1], want)
	}
	if !errors.Is(errs[1], syscall.EISDIR) {
		t.Errorf("rank 1's error does not wrap EISDIR: %#v", errs[1])
	}
	restore(t, comms, dir, 1, 1)
}

func TestSaveWriteErrorSaysFileOnceS3(t *testing.T) {
	v := startVersity(t, "ckpt")
	loc := "s3://ckpt/job"
	comms := newJob(t, 2)
	testHook = func(p string, rank int) error {
		if p == "write" && rank == 1 {
			v.Kill() // after rank 1's shard, before its blob
		}
		return nil
	}
	errs := save(t, comms, loc, 2, 2)
	testHook = nil
	v.Restart()
	err := errs[1]
	t.Log(err)
	prefix := "checkpoint: step 2: " + loc + "/" + stepKey(2) + "/" + blobName(1) + ": writing: "
	if err == nil || !strings.HasPrefix(err.Error(), prefix) || strings.Count(err.Error(), "s3://") != 1 ||
		!strings.HasSuffix(err.Error(), "(previous checkpoint kept)") {
		t.Errorf("rank 1: %v\nwant it to start %q and name s3:// once", err, prefix)
	}
}

// A save that cannot prepare its step on S3 (the server is gone) says the
// step's location once, without a second "checkpoint: ", sync and async
// alike, and keeps the previous checkpoint.
func TestPrepareErrorSaysLocationOnceS3(t *testing.T) {
	v := startVersity(t, "ckpt")
	loc := "s3://ckpt/down"
	comms := newJob(t, 2)
	ms := managers(t, comms, loc, WithLogger(t.Logf))
	v.Kill()
	errs := onEach(comms, func(r int, c *collective.Comm) error {
		s := newRankState(r)
		s.fill(15, r)
		err := ms[r].Save(context.Background(), 15, s.st)
		aerr := ms[r].SaveAsync(context.Background(), 16, s.st)
		return errors.Join(err, aerr)
	})
	v.Restart()
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: the saves succeeded with the server down", r)
		}
		lines := strings.Split(err.Error(), "\n")
		t.Logf("rank %d:\n%s", r, err)
		for i, l := range lines {
			step := int64(15 + i)
			head, tail := fmt.Sprintf("checkpoint: step %d: ", step), " (previous checkpoint kept)"
			if i == 1 {
				head, tail = fmt.Sprintf("checkpoint: async save of step %d: ", step), "; previous checkpoint kept"
			}
			head += "preparing " + loc + "/" + stepKey(step) + ": "
			what := "listing: connect: connection refused"
			if r == 1 {
				what = "rank 0 failed (see its log for the cause)"
			}
			if !strings.HasPrefix(l, head+what) || !strings.HasSuffix(l, tail) || strings.Count(l, "s3://") != 1 || strings.Count(l, "checkpoint: ") != 1 {
				t.Errorf("rank %d: %s\nwant it to start %q, end %q and name s3:// and checkpoint: once", r, l, head+what, tail)
			}
		}
		if len(lines) != 2 {
			t.Errorf("rank %d: %d errors, want 2", r, len(lines))
		}
	}
}
