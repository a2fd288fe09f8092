package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
// hold (Manifest.Holds). One of them missing or damaged here while other
// hosts should hold copies makes the entry Degraded, not corrupted: a
// restore reads it from another host and writes it back here. Only a file
// that no other host should hold makes it corrupted.
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
	return scanEntries(entries, func(e *Entry) error { return storeCheckHere(ctx, s, e) }), nil
}

// storeCheckHere reads e's manifest and verifies the files this location
// should hold, setting e.Manifest and e.Degraded; the error is why the
// step cannot be restored.
func storeCheckHere(ctx context.Context, s Store, e *Entry) error {
	m, err := storeReadManifest(ctx, s, e.Step)
	e.Manifest = m
	if err != nil {
		return err
	}
	var heal, damaged []string
	for _, f := range m.Files() {
		if !m.Holds(f) {
			continue
		}
		err := storeCheckFile(ctx, s, e.Step, f, io.Discard)
		if err == nil {
			continue
		}
		others := slices.DeleteFunc(slices.Clone(f.Hosts), func(h int) bool { return h == m.Host })
		if !m.Replicated() || len(others) == 0 {
			return err
		}
		what := err.Error()
		if errors.Is(err, fs.ErrNotExist) {
			what = f.File + " is missing here"
		}
		also := map[bool]string{true: "keeps it", false: "keep it"}[len(others) == 1]
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errWrongSize) {
			heal = append(heal, fmt.Sprintf("%s (%s also %s)", what, hostList(others), also))
		} else {
			damaged = append(damaged, fmt.Sprintf("%s (%s also %s)", what, hostList(others), also))
		}
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
			verified := "its checksums verify"
			if e.Degraded != "" {
				verified = "the files this directory holds verify; the ones it lacks or holds damaged are read from other hosts (not checked here)"
			}
			if len(skipped) == 0 {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint and %s", e.Step, verified)
			} else {
				r.Reason = fmt.Sprintf("step %d is the newest committed checkpoint that verifies (skipped: %s)", e.Step, strings.Join(skipped, "; "))
				if e.Degraded != "" {
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
