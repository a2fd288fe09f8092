package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Entry is one checkpoint directory found by Scan.
type Entry struct {
	Step      int64
	Dir       string
	Committed bool      // manifest.json exists
	Manifest  *Manifest // nil when not committed or unreadable
	Problem   string    // why it cannot be restored; "" when it verified
	// Degraded says which files of a replicated checkpoint this directory
	// should hold but lacks or holds damaged, while other hosts should
	// hold intact copies: a restore reads them from there and writes them
	// back here. "" when every file this directory should hold verified.
	Degraded string
	// Unchecked names the other hosts' copies of a replicated checkpoint
	// that a restore may need but Scan could not check from here (see
	// Scan); "" when there are none.
	Unchecked string
	// Uploads are the step's incomplete uploads (an object store's
	// multipart uploads never completed; uploads.go): storage its save
	// left behind that no object shows. A step may have nothing else.
	Uploads []Upload
}

// Report is what Scan found in a checkpoint directory.
type Report struct {
	Entries []Entry // newest first
	Pick    int64   // the step a restore would load; -1 for none
	Reason  string  // why that one
}

// Scan lists the checkpoints under dir and verifies every committed one
// (manifest, file sizes, sha256), newest first, and says which one a restore
// would pick: the newest committed checkpoint that verifies. A directory
// without checkpoints is an empty report; a dir that does not exist or is
// not a directory is an error (Restore, by contrast, starts fresh there: a
// new job's directory need not exist yet, but a path given to look at
// checkpoints that is not there is most likely mistyped).
//
// In a replicated checkpoint (Manifest.Replicated: each host's directory
// holds some of the files) Scan checks the files this directory should
// hold (Manifest.Holds). When dir has "{host}", it also looks for the
// other hosts' directories beside this one (dir with any name for {host})
// and checks there the copies a restore would read: of the files this
// directory lacks or holds damaged, and of those only other hosts keep. A
// file missing or damaged here whose copy on another host verifies makes
// the entry Degraded, not corrupted: a restore reads it from there and
// writes it back here. A file of which no copy verifies makes it
// corrupted (a restore falls back past it). The copies Scan could not
// reach (dir without "{host}", or another host's directory not found) are
// said in Unchecked, never taken as good from the manifest.
//
// dir may also be an s3:// location; the bucket must then exist. "{host}"
// in a directory is expanded as New expands it (ExpandHost).
func Scan(dir string) (*Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	s, err := openExisting(ctx, dir)
	if err != nil {
		return nil, err
	}
	entries, err := storeStepsAndUploads(ctx, s)
	if err != nil {
		return nil, pkgErr(err)
	}
	peers := findPeers(dir, s.String())
	return scanEntries(entries, func(e *Entry) error { return storeCheck(ctx, s, e, peers) }), nil
}

// storeCheck reads e's manifest and verifies the files this location
// should hold and, for a replicated checkpoint, the other hosts' copies it
// can reach (peers: the other directories of a "{host}" location; nil when
// there is none) of the files a restore would read from them. It sets
// e.Manifest, e.Degraded and e.Unchecked; the error is why the step cannot
// be restored.
func storeCheck(ctx context.Context, s Store, e *Entry, peers peerDirs) error {
	m, err := storeReadManifest(ctx, s, e.Step)
	e.Manifest = m
	if err != nil {
		return err
	}
	var dirs map[int]string // the other hosts' copies reachable from here
	if m.Replicated() && peers != nil {
		dirs = peers.copies(ctx, m)
	}
	var heal, damaged, lost []string
	unchecked := map[int]bool{}
	for _, f := range m.Files() {
		here := m.Holds(f)
		var herr error
		if here {
			if herr = storeCheckFile(ctx, s, e.Step, f, io.Discard); herr == nil {
				continue
			}
		}
		others := slices.DeleteFunc(slices.Clone(f.Hosts), func(h int) bool { return h == m.Host })
		if !m.Replicated() || len(others) == 0 {
			return herr // not replicated, every file is here
		}
		if !here && peers == nil {
			for _, h := range others {
				unchecked[h] = true
			}
			continue // said once, for all the files only other hosts keep
		}
		found := checkElsewhere(ctx, e.Step, f, others, dirs)
		for _, h := range found.unchecked {
			unchecked[h] = true
		}
		var note string
		switch {
		case found.good != "":
			note = "its copy in " + found.good + " verifies"
		case len(found.unchecked) > 0:
			note = fmt.Sprintf("%s should keep another copy: not checked", hostList(found.unchecked))
		}
		bad := found.bad
		if here {
			bad = append([]string{copyProblem(herr, f, "here")}, bad...)
		}
		if found.good == "" && len(found.unchecked) == 0 {
			lost = append(lost, fmt.Sprintf("no intact copy of %s is left (%s)", f.File, strings.Join(bad, "; ")))
			continue
		}
		if !here {
			continue
		}
		what := herr.Error()
		if errors.Is(herr, fs.ErrNotExist) {
			what = f.File + " is missing here"
		}
		if len(found.bad) > 0 {
			note = strings.Join(found.bad, "; ") + "; " + note
		}
		if errors.Is(herr, fs.ErrNotExist) || errors.Is(herr, errWrongSize) {
			heal = append(heal, fmt.Sprintf("%s (%s)", what, note))
		} else {
			damaged = append(damaged, fmt.Sprintf("%s (%s)", what, note))
		}
	}
	if len(lost) > 0 {
		return errors.New(strings.Join(lost, "; "))
	}
	var parts []string
	if len(heal) > 0 {
		it := map[bool]string{true: "it", false: "them"}[len(heal) == 1]
		parts = append(parts, fmt.Sprintf("%s; the next restore reads %s from another host and writes %s back here", strings.Join(heal, "; "), it, it))
	}
	if len(damaged) > 0 {
		parts = append(parts, fmt.Sprintf("%s; a restore uses another host's copy (remove this one, and the next restore writes it back here)", strings.Join(damaged, "; ")))
	}
	e.Degraded = strings.Join(parts, "; ")
	if len(unchecked) > 0 {
		hs := slices.Sorted(maps.Keys(unchecked))
		if peers == nil {
			e.Unchecked = fmt.Sprintf("the copies on %s were not checked (give the location with {host} where the other hosts' directories are reachable, or verify on every host)", hostList(hs))
		} else {
			e.Unchecked = fmt.Sprintf("the copies on %s were not checked (no directory of theirs found beside this one)", hostList(hs))
		}
	}
	return nil
}

// hostList names storage domains: "host 2", "hosts 0 and 2", "hosts 0, 1 and 2".
func hostList(hs []int) string {
	if len(hs) == 1 {
		return fmt.Sprintf("host %d", hs[0])
	}
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = strconv.Itoa(h)
	}
	return "hosts " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// pickVerified says what was verified of the checkpoint a restore would
// pick, e, and what was not.
func pickVerified(e *Entry) string {
	m := e.Manifest
	switch {
	case m == nil || !m.Replicated():
		return "its checksums verify"
	case e.Unchecked != "":
		v := "the files this directory holds verify"
		if e.Degraded != "" {
			v = "the files this directory holds verify but for those it lacks or holds damaged"
		}
		return v + "; " + e.Unchecked + ", and a restore needs them"
	case e.Degraded != "":
		return "the files this directory holds verify but for those it lacks or holds damaged, whose copies on other hosts verify: a restore reads them from there"
	}
	return "its checksums verify, here and in the other hosts' directories"
}

// checkScanDir rejects a path that is not an existing directory.
func checkScanDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("checkpoint: %s does not exist: give the directory the job was given (checkpoint.New, --checkpoint-dir)", dir)
	case err != nil:
		return fmt.Errorf("checkpoint: %w", err)
	case !st.IsDir():
		return fmt.Errorf("checkpoint: %s is not a directory: give the directory the job was given (checkpoint.New, --checkpoint-dir)", dir)
	}
	return nil
}

func scanEntries(entries []Entry, check func(*Entry) error) *Report {
	r := &Report{Entries: entries, Pick: -1}
	var skipped []string
	for i := range r.Entries {
		e := &r.Entries[i]
		if !e.Committed {
			e.Problem = notCommitted
			continue
		}
		if err := check(e); err != nil {
			e.Problem = "corrupted: " + err.Error()
		}
		if e.Problem == "" && r.Pick < 0 {
			r.Pick = e.Step
			verified := pickVerified(e)
			if len(skipped) == 0 {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint and %s", e.Step, verified)
			} else {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint that verifies (skipped: %s)", e.Step, strings.Join(skipped, "; "))
				if m := e.Manifest; m != nil && m.Replicated() {
					r.Reason += "; " + verified
				}
			}
		} else if e.Problem != "" && r.Pick < 0 && e.Committed {
			skipped = append(skipped, fmt.Sprintf("step %d %s", e.Step, e.Problem))
		}
	}
	if r.Pick < 0 {
		switch {
		case len(skipped) > 0:
			r.Reason = "no committed checkpoint verifies: " + strings.Join(skipped, "; ")
		default:
			r.Reason = "no committed checkpoint: a restore starts fresh"
		}
	}
	return r
}

// List returns the checkpoints at loc (a directory or s3://bucket/prefix),
// newest first, each with Committed set, its incomplete uploads (Uploads;
// a step may have nothing else) and, when it is committed and its
// manifest reads and parses, Manifest. It reads the manifests only, never
// the shards, so it is fast whatever the checkpoints' size, and it checks
// nothing beyond the manifests: Problem says why a step is not committed or
// why its manifest could not be read, and is "" otherwise (Scan verifies).
// A directory that does not exist or is not a directory is an error, in
// Scan's words. "{host}" in a directory is expanded (ExpandHost).
func List(ctx context.Context, loc string) ([]Entry, error) {
	s, entries, err := listLoc(ctx, loc)
	if err != nil {
		return nil, err
	}
	for i := range entries {
		e := &entries[i]
		if !e.Committed {
			e.Problem = notCommitted
			continue
		}
		m, err := storeReadManifest(ctx, s, e.Step)
		if err != nil {
			e.Problem = "corrupted: " + err.Error()
			continue
		}
		e.Manifest = m
	}
	return entries, nil
}

// Remove deletes the checkpoint of step at loc (a directory or
// s3://bucket/prefix), committed or not: its manifest first, so that a
// removal cut short leaves an uncommitted step that Restore skips, never a
// committed one with files missing; then it aborts the step's incomplete
// uploads (Entry.Uploads). A step that is not there is an error
// that lists the steps that are. "{host}" in a directory is expanded
// (ExpandHost). With replicated local checkpoints it removes the step from
// this location only.
func Remove(ctx context.Context, loc string, step int64) error {
	loc, err := ExpandHost(loc)
	if err != nil {
		return err
	}
	s, entries, err := listLoc(ctx, loc)
	if err != nil {
		return err
	}
	found := false
	steps := make([]string, len(entries))
	for i, e := range entries {
		steps[i] = strconv.FormatInt(e.Step, 10)
		found = found || e.Step == step
	}
	if !found {
		there := "none"
		if len(steps) > 0 {
			there = strings.Join(steps, ", ")
		}
		return fmt.Errorf("checkpoint: no step %d in %s (steps there: %s)", step, loc, there)
	}
	if err := storeDeleteStep(ctx, s, step, nil, false); err != nil {
		return wrapErr(err, "removing step %d from %s", step, loc)
	}
	return nil
}

// notCommitted is Entry.Problem of a step without a manifest, as Scan says it.
const notCommitted = "not committed (no " + ManifestName + "): a save that did not finish, or a deletion in progress"

// listLoc opens loc's Store and lists its steps, newest first. A directory
// must exist and be one (in Scan's words).
func listLoc(ctx context.Context, loc string) (Store, []Entry, error) {
	s, err := openExisting(ctx, loc)
	if err != nil {
		return nil, nil, err
	}
	entries, err := storeStepsAndUploads(ctx, s)
	if err != nil {
		return nil, nil, wrapErr(err, "listing %s", loc)
	}
	return s, entries, nil
}

// wrapErr says what failed, unless err (from the S3 back end) already does.
func wrapErr(err error, format string, args ...any) error {
	if strings.HasPrefix(err.Error(), "checkpoint: ") {
		return err
	}
	return fmt.Errorf("checkpoint: "+format+": %w", append(args, err)...)
}
