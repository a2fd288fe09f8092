package checkpoint

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// List returns the checkpoints at loc (a directory or s3://bucket/prefix),
// newest first, each with Committed set and, when it is committed and its
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
// committed one with files missing. A step that is not there is an error
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
	if err := storeDeleteStep(ctx, s, step, nil); err != nil {
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
	entries, err := storeSteps(ctx, s)
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
