package checkpoint

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// Incomplete uploads are the parts of objects that were never finished: a
// rank that dies, or loses its store, in the middle of a multipart upload
// to S3 leaves the parts stored so far, and an abort that cannot reach the
// store leaves them too. S3 keeps them, and bills them, until they are
// aborted, and no listing of objects shows them. So List and Scan report
// them with their steps (Entry.Uploads; gorun checkpoint ls and verify),
// Remove aborts those of the step it removes (gorun checkpoint rm), and
// retention, after every save, aborts those of every step up to the saved
// one (the job wrote them, and its saves of those steps are over), and
// those of later steps once they are older than WithStaleUploadAge. Only
// keys under step-<N>/ are the job's: other uploads under the location
// are left alone.

// Upload is an incomplete upload of a checkpoint's object.
type Upload struct {
	Key     string    // relative to the location: "step-000000000120/shard-00000-of-00004.bin"
	ID      string    // the store's upload ID
	Started time.Time // when it was started
	Parts   int       // the parts it stored
	Bytes   int64     // their size
}

// DefaultStaleUploadAge is the age from which retention aborts an
// incomplete upload of a step newer than the one just saved (WithStaleUploadAge).
const DefaultStaleUploadAge = time.Hour

// WithStaleUploadAge sets the age from which a save's retention aborts the
// incomplete uploads of steps newer than the one it saved (default
// DefaultStaleUploadAge): no save of this job writes them, but an upload
// that young may still belong to a writer the job does not know of (a
// previous run still being stopped). Uploads of the saved step and older
// ones are aborted whatever their age.
func WithStaleUploadAge(d time.Duration) Option { return func(m *Manager) { m.staleUploads = d } }

// storeUploads lists the incomplete uploads of s's steps, by step; none
// when s keeps no uploads.
func storeUploads(ctx context.Context, s Store) (map[int64][]Upload, error) {
	uk, ok := s.(uploadKeeper)
	if !ok {
		return nil, nil
	}
	ups, err := uk.uploads(ctx, "step-")
	if err != nil {
		return nil, err
	}
	byStep := map[int64][]Upload{}
	for _, u := range ups {
		if step, _, ok := parseStepKey(u.Key); ok {
			byStep[step] = append(byStep[step], u)
		}
	}
	return byStep, nil
}

// withUploads sets the uploads of entries (newest first) and adds an
// uncommitted entry for each step that has nothing but uploads.
func withUploads(s Store, entries []Entry, ups map[int64][]Upload) []Entry {
	if len(ups) == 0 {
		return entries
	}
	seen := map[int64]bool{}
	for i := range entries {
		entries[i].Uploads = ups[entries[i].Step]
		seen[entries[i].Step] = true
	}
	for step, us := range ups {
		if !seen[step] {
			entries = append(entries, Entry{Step: step, Dir: entryDir(s, step), Uploads: us})
		}
	}
	slices.SortFunc(entries, func(a, b Entry) int { return cmp.Compare(b.Step, a.Step) })
	return entries
}

// storeStepsAndUploads is storeSteps with the incomplete uploads of the
// steps (withUploads).
func storeStepsAndUploads(ctx context.Context, s Store) ([]Entry, error) {
	entries, err := storeSteps(ctx, s)
	if err != nil {
		return nil, err
	}
	ups, err := storeUploads(ctx, s)
	if err != nil {
		return nil, err
	}
	return withUploads(s, entries, ups), nil
}

// abortUploads aborts us, stopping at the first failure.
func abortUploads(ctx context.Context, uk uploadKeeper, us []Upload) error {
	for _, u := range us {
		if err := uk.abortUpload(ctx, u); err != nil {
			return err
		}
	}
	return nil
}
