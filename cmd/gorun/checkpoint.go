package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gorun/gorun/checkpoint"
)

// replicatedHelp is what inspect and verify say of replicated checkpoints.
const replicatedHelp = `With replicated local checkpoints (a "{host}" directory on every host, and
--checkpoint-replicas k) each host's directory holds only the files of
its own ranks and of the k hosts before it: it checks those, and says so
("this directory holds 4 of 8 files, host 1 of 3; each file is on 2
hosts"). A file that should be here but is missing or damaged, while other
hosts keep copies, is not corruption: the checkpoint says DEGRADED, the
next restore reads the file from another host and writes it back here,
and the command exits 2 (when nothing is corrupted). Given with "{host}"
(quoted from the shell), it also checks the other hosts' copies in the
directories beside this one (the location with another name for {host}:
a shared filesystem, or the hosts' disks mounted side by side): those of
the files this directory lacks or holds damaged, and those only other
hosts keep. A file of which no copy verifies is corruption, and the
restore falls back past the step, as verify then says. The copies it
cannot reach are said to be unchecked: run it on every host to check
every copy.`

// s3Help is what every checkpoint subcommand says of its LOCATION.
const s3Help = `LOCATION may be s3://bucket/prefix, with the AWS environment described in
package checkpoint (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
AWS_PROFILE, AWS_ENDPOINT_URL, AWS_S3_FORCE_PATH_STYLE=true); the bucket
must exist. In a directory LOCATION, "{host}" stands for $GORUN_HOST, else
this host's name, as in checkpoint.New: quote it from the shell.`

// uploadsHelp is what ls, verify and inspect say of incomplete uploads.
const uploadsHelp = `At an s3:// LOCATION it also lists the incomplete uploads of each step
(multipart uploads a rank began and never completed or aborted, because it
died or lost the store in the middle of a big object): their file, parts,
size and age. S3 keeps and bills their parts, but no listing of objects
shows them. gorun checkpoint rm STEP aborts a step's; the job's next save
aborts those of the steps up to the one it saved, and those of later steps
once they are an hour old.`

// location is the checkpoint location a subcommand was given, with "{host}"
// expanded as the library expands it (checkpoint.ExpandHost), for the
// messages; the library functions take either.
func location(loc string) (string, error) { return checkpoint.ExpandHost(loc) }

// degradedError is what inspect and verify return when the checkpoints
// restore but this directory lacks, or holds damaged, some files of a
// replicated checkpoint that other hosts keep too: exit status 2, so that a
// script tells "this host's copy needs a restore to heal" from "corrupted"
// (1).
func degradedError(w io.Writer, n int, loc string) error {
	fmt.Fprintf(w, "gorun: %d committed checkpoint(s) in %s are DEGRADED: files this directory should hold are missing or damaged, and other hosts keep copies (see above)\n", n, loc)
	return exitError(2)
}

func newCheckpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Look at, verify and remove the barrier checkpoints a job wrote (see package checkpoint)",
	}
	inspect := &cobra.Command{
		Use:   "inspect DIR",
		Short: "List, verify and explain the checkpoints in DIR",
		Long: `gorun checkpoint inspect lists every checkpoint under DIR (the directory
given to checkpoint.New): its step, the world size that wrote it, its tensors
(name, shape, dtype), its files and size. It verifies every committed
checkpoint (each file's size and sha256 against the manifest), reports the
ones that are corrupted or were never committed, and says which checkpoint a
restore would pick and why. It exits 1 when DIR does not exist or is not a
directory, or when a committed checkpoint is corrupted; an existing DIR
without checkpoints prints "no checkpoints in DIR" and exits 0.

` + replicatedHelp + `

` + strings.ReplaceAll(uploadsHelp, "LOCATION", "DIR") + `

DIR may be s3://bucket/prefix, with the AWS environment described in
package checkpoint (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
AWS_PROFILE, AWS_ENDPOINT_URL, AWS_S3_FORCE_PATH_STYLE=true); the bucket
must exist. In a directory DIR, "{host}" stands for $GORUN_HOST, else this
host's name, as in checkpoint.New.`,
		Example:       "  gorun checkpoint inspect /shared/ckpt\n  AWS_ENDPOINT_URL=http://127.0.0.1:7070 AWS_S3_FORCE_PATH_STYLE=true gorun checkpoint inspect s3://ckpt/job1",
		Args:          cobra.ExactArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return scanAndReport(cmd, args[0], printReport, false)
		},
	}
	ls := &cobra.Command{
		Use:   "ls LOCATION",
		Short: "List the checkpoints at LOCATION quickly, from their manifests alone",
		Long: `gorun checkpoint ls prints one line per checkpoint at LOCATION (the
directory or s3:// location given to checkpoint.New), newest first: its step,
whether it is committed (its manifest.json exists) or NOT COMMITTED (a save
that did not finish, or a deletion in progress), and, from the manifest, the
world size that wrote it, the size of the whole checkpoint and its number of
files (shards and per-rank state, the manifest aside); for a replicated
checkpoint (replicated local checkpoints, a "{host}" directory on every
host), what this directory holds of it, which host it is and on how many
hosts each file is kept. It reads the
manifests only, never the shards, so it is fast however big the checkpoints
are, and it checks nothing beyond them: gorun checkpoint verify checks every
file. It exits 1 when LOCATION is a directory that does not exist; one
without checkpoints prints "no checkpoints in LOCATION".

` + uploadsHelp + `

` + s3Help,
		Example:       "  gorun checkpoint ls /shared/ckpt\n  AWS_ENDPOINT_URL=http://127.0.0.1:7070 AWS_S3_FORCE_PATH_STYLE=true gorun checkpoint ls s3://ckpt/job1",
		Args:          exactLocation("ls"),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			if args[0], err = location(args[0]); err != nil {
				return err
			}
			entries, err := checkpoint.List(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			printList(cmd.OutOrStdout(), args[0], entries)
			return nil
		},
	}
	verify := &cobra.Command{
		Use:   "verify LOCATION",
		Short: "Verify every committed checkpoint at LOCATION and say which one a restore would pick",
		Long: `gorun checkpoint verify reads every committed checkpoint at LOCATION (the
directory or s3:// location given to checkpoint.New) and checks each file's
size and sha256 against its manifest. It prints one line per committed
checkpoint, "ok" or "CORRUPTED" with the reason (the file and what is wrong
with it), then which checkpoint a restore would pick and why. Checkpoints
that were never committed are not verified (a restore skips them). It exits
1 when a committed checkpoint is corrupted, when none verifies (no
checkpoint at all included), or when LOCATION is a directory that does not
exist.

` + replicatedHelp + `

` + uploadsHelp + `

` + s3Help,
		Example:       "  gorun checkpoint verify /shared/ckpt\n  AWS_ENDPOINT_URL=http://127.0.0.1:7070 AWS_S3_FORCE_PATH_STYLE=true gorun checkpoint verify s3://ckpt/job1",
		Args:          exactLocation("verify"),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return scanAndReport(cmd, args[0], printVerify, true)
		},
	}
	var all bool
	rm := &cobra.Command{
		Use:   "rm [--all] LOCATION [STEP...]",
		Short: "Remove checkpoints from LOCATION: the given steps, or --all",
		Long: `gorun checkpoint rm removes the checkpoints of the given steps from LOCATION
(the directory or s3:// location given to checkpoint.New), committed or not,
each one's manifest first: a removal cut short leaves an uncommitted
checkpoint, which a restore skips, never a committed one with files
missing; then it aborts the step's incomplete uploads (at an s3://
LOCATION: multipart uploads never completed, which S3 keeps and bills; a
step may have nothing else, and gorun checkpoint ls shows them). With
--all it removes every checkpoint there. It prints each step it removed. Before removing anything it checks that every STEP is a
non-negative integer and is there (gorun checkpoint ls lists them); if one
is not, it says which and removes nothing. Do not remove checkpoints of a
job that is running: it may be restoring one. With replicated local
checkpoints (a "{host}" directory on every host) it removes the step from
LOCATION only: run it on every host.

` + s3Help,
		Example: "  gorun checkpoint rm /shared/ckpt 100 120\n  gorun checkpoint rm --all s3://ckpt/job1",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("checkpoint rm: no LOCATION: gorun checkpoint rm LOCATION STEP..., or gorun checkpoint rm --all LOCATION")
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			if args[0], err = location(args[0]); err != nil {
				return err
			}
			return removeSteps(cmd.Context(), cmd.OutOrStdout(), args[0], args[1:], all)
		},
	}
	rm.Flags().BoolVar(&all, "all", false, "remove every checkpoint at LOCATION")
	rm.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		// "rm DIR -5": a negative STEP reads as a flag.
		if _, arg, ok := strings.Cut(err.Error(), " in "); ok && strings.HasPrefix(err.Error(), "unknown shorthand flag") {
			if _, nerr := strconv.ParseInt(arg, 10, 64); nerr == nil {
				return badStep(arg)
			}
		}
		return fmt.Errorf("checkpoint rm: %v (gorun checkpoint rm --help)", err)
	})
	cmd.AddCommand(inspect, ls, verify, rm)
	return cmd
}

// exactLocation accepts exactly one argument, LOCATION.
func exactLocation(sub string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("checkpoint %s takes one LOCATION (a directory or s3://bucket/prefix), got %d arguments: gorun checkpoint %s LOCATION", sub, len(args), sub)
		}
		return nil
	}
}

// removeSteps is gorun checkpoint rm.
func removeSteps(ctx context.Context, w io.Writer, loc string, args []string, all bool) error {
	switch {
	case all && len(args) > 0:
		return fmt.Errorf("checkpoint rm: --all and steps (%s) both given: give the steps to remove, or --all", strings.Join(args, " "))
	case !all && len(args) == 0:
		return fmt.Errorf("checkpoint rm: no step to remove: gorun checkpoint rm %s STEP... (gorun checkpoint ls %s lists them), or --all", loc, loc)
	}
	var steps []int64
	for _, a := range args {
		step, err := strconv.ParseInt(a, 10, 64)
		if err != nil || step < 0 || strings.HasPrefix(a, "+") {
			return badStep(a)
		}
		if !slices.Contains(steps, step) {
			steps = append(steps, step)
		}
	}
	entries, err := checkpoint.List(ctx, loc)
	if err != nil {
		return err
	}
	dirs := map[int64]string{}
	uploads := map[int64]int{}
	for _, e := range entries {
		dirs[e.Step], uploads[e.Step] = e.Dir, len(e.Uploads)
	}
	if all {
		if len(entries) == 0 {
			fmt.Fprintf(w, "no checkpoints in %s: nothing to remove\n", loc)
			return nil
		}
		for i := len(entries) - 1; i >= 0; i-- { // oldest first
			steps = append(steps, entries[i].Step)
		}
	}
	for _, step := range steps {
		if _, ok := dirs[step]; !ok {
			// Remove says so, listing the steps there, and removes nothing.
			err := checkpoint.Remove(ctx, loc, step)
			if err == nil {
				err = fmt.Errorf("checkpoint: no step %d in %s", step, loc)
			}
			return fmt.Errorf("%v: nothing was removed", err)
		}
	}
	for _, step := range steps {
		if err := checkpoint.Remove(ctx, loc, step); err != nil {
			return err
		}
		aborted := ""
		if n := uploads[step]; n > 0 {
			aborted = fmt.Sprintf(", and aborted its %d incomplete upload(s)", n)
		}
		fmt.Fprintf(w, "removed step %d (%s)%s\n", step, dirs[step], aborted)
	}
	return nil
}

func badStep(arg string) error {
	return fmt.Errorf("checkpoint rm: STEP %q is not a step number (a non-negative integer, as gorun checkpoint ls prints): nothing was removed", arg)
}

// printList is gorun checkpoint ls.
func printList(w io.Writer, loc string, entries []checkpoint.Entry) {
	if len(entries) == 0 {
		fmt.Fprintf(w, "no checkpoints in %s\n", loc)
		return
	}
	width := 0
	for _, e := range entries {
		width = max(width, len(strconv.FormatInt(e.Step, 10)))
	}
	for _, e := range entries {
		fmt.Fprintf(w, "step %-*d  ", width, e.Step)
		switch m := e.Manifest; {
		case !e.Committed:
			fmt.Fprintf(w, "NOT COMMITTED  (no %s: a save that did not finish, or a deletion in progress)\n", checkpoint.ManifestName)
		case m == nil:
			fmt.Fprintf(w, "committed      manifest unreadable: %s\n", strings.TrimPrefix(e.Problem, "corrupted: "))
		case m.Replicated():
			files, bytes := m.Here()
			fmt.Fprintf(w, "committed      world size %d  %s of %s here, %d of %d files (%s)\n",
				m.WorldSize, humanBytes(bytes), humanBytes(m.Size()), files, len(m.Shards)+len(m.Blobs), m.Placement())
		default:
			fmt.Fprintf(w, "committed      world size %d  %s in %d files\n", m.WorldSize, humanBytes(m.Size()), len(m.Shards)+len(m.Blobs))
		}
		printUploads(w, "  ", e)
	}
	uploadsFooter(w, entries)
}

// printUploads writes a line per incomplete upload of e, after indent.
func printUploads(w io.Writer, indent string, e checkpoint.Entry) {
	for _, u := range e.Uploads {
		_, file, _ := strings.Cut(u.Key, "/")
		fmt.Fprintf(w, "%sincomplete upload of %s: %d part(s), %s, started %s ago\n", indent, file, u.Parts, humanBytes(u.Bytes), time.Since(u.Started).Round(time.Second))
	}
}

// uploadsFooter says what the incomplete uploads of entries are and what
// removes them, when there are any.
func uploadsFooter(w io.Writer, entries []checkpoint.Entry) {
	n, bytes := 0, int64(0)
	for _, e := range entries {
		for _, u := range e.Uploads {
			n++
			bytes += u.Bytes
		}
	}
	if n > 0 {
		fmt.Fprintf(w, "%d incomplete upload(s) hold %s that no object shows (saves cut off in a big object): gorun checkpoint rm STEP aborts a step's; the job's next save those up to its step, and later ones after an hour\n", n, humanBytes(bytes))
	}
}

// okStatus is how inspect and verify say that a committed checkpoint
// verified, or is DEGRADED: for a replicated one, what this directory holds.
func okStatus(e checkpoint.Entry) string {
	m := e.Manifest
	if m == nil || !m.Replicated() {
		return "ok (checksums verified)"
	}
	files, _ := m.Here()
	holds := fmt.Sprintf("this directory holds %d of %d files, %s", files, len(m.Shards)+len(m.Blobs), m.Placement())
	if e.Degraded != "" {
		return fmt.Sprintf("DEGRADED (%s): %s", holds, e.Degraded)
	}
	return fmt.Sprintf("ok (checksums verified; %s)", holds)
}

// printVerify is gorun checkpoint verify: a line per committed checkpoint,
// then the pick.
func printVerify(w io.Writer, loc string, r *checkpoint.Report) (corrupt, degraded int) {
	if len(r.Entries) == 0 {
		fmt.Fprintf(w, "no checkpoints in %s\n", loc)
	}
	var uncommitted []string
	for _, e := range r.Entries {
		switch {
		case !e.Committed:
			uncommitted = append(uncommitted, strconv.FormatInt(e.Step, 10))
		case e.Problem != "":
			fmt.Fprintf(w, "step %d  CORRUPTED: %s\n", e.Step, strings.TrimPrefix(e.Problem, "corrupted: "))
			corrupt++
		default:
			if e.Degraded != "" {
				degraded++
			}
			fmt.Fprintf(w, "step %d  %s\n", e.Step, okStatus(e))
		}
	}
	if len(uncommitted) > 0 {
		fmt.Fprintf(w, "not verified, NOT COMMITTED (a restore skips them): step %s\n", strings.Join(uncommitted, ", "))
	}
	for _, e := range r.Entries {
		printUploads(w, fmt.Sprintf("step %d  ", e.Step), e)
	}
	uploadsFooter(w, r.Entries)
	if r.Pick >= 0 {
		fmt.Fprintf(w, "restore would pick step %d: %s\n", r.Pick, r.Reason)
	} else {
		fmt.Fprintf(w, "restore would pick nothing: %s\n", r.Reason)
	}
	return corrupt, degraded
}

// humanBytes writes a size as 812 B, 3.1 KiB, 14.2 MiB, 1.50 GiB.
func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// printReport is gorun checkpoint inspect.
func printReport(w io.Writer, dir string, r *checkpoint.Report) (corrupt, degraded int) {
	if len(r.Entries) == 0 {
		fmt.Fprintf(w, "no checkpoints in %s\n", dir)
	}
	for _, e := range r.Entries {
		status := okStatus(e)
		switch {
		case !e.Committed:
			status = strings.Replace(e.Problem, "not committed", "NOT COMMITTED", 1)
		case e.Problem != "":
			status = "CORRUPTED: " + strings.TrimPrefix(e.Problem, "corrupted: ")
			corrupt++
		case e.Degraded != "":
			degraded++
		}
		fmt.Fprintf(w, "step %d  %s\n", e.Step, e.Dir)
		fmt.Fprintf(w, "  status: %s\n", status)
		if m := e.Manifest; m != nil && m.Replicated() {
			files, bytes := m.Here()
			fmt.Fprintf(w, "  world size %d, %d bytes of tensors, %d bytes in %d files, of which this directory holds %d bytes in %d files (%s)\n",
				m.WorldSize, m.TotalBytes, m.Size(), len(m.Shards)+len(m.Blobs), bytes, files, m.Placement())
		} else if m != nil {
			fmt.Fprintf(w, "  world size %d, %d bytes of tensors, %d bytes on disk in %d files\n",
				m.WorldSize, m.TotalBytes, m.Size(), len(m.Shards)+len(m.Blobs))
			for _, t := range m.Tensors {
				fmt.Fprintf(w, "  tensor %-20s %-8s shape %v (%d bytes)\n", t.Name, t.DType, t.Shape, t.Bytes)
			}
			if len(m.Blobs) > 0 && len(m.Blobs[0].Blobs) > 0 {
				fmt.Fprintf(w, "  per-rank state: %s\n", strings.Join(m.Blobs[0].Blobs, ", "))
			}
		}
		printUploads(w, "  ", e)
	}
	uploadsFooter(w, r.Entries)
	if r.Pick >= 0 {
		fmt.Fprintf(w, "restore would pick step %d: %s\n", r.Pick, r.Reason)
	} else {
		fmt.Fprintf(w, "restore would pick nothing: %s\n", r.Reason)
	}
	return corrupt, degraded
}

// optionalInt is an int flag that may be left unset (--checkpoint-replicas:
// unset leaves the library's default), so that no value stands for "unset".
type optionalInt struct {
	v   int
	set bool
}

func (o *optionalInt) String() string {
	if !o.set {
		return ""
	}
	return strconv.Itoa(o.v)
}

func (o *optionalInt) Set(s string) error {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not an integer", s)
	}
	o.v, o.set = v, true
	return nil
}

func (o *optionalInt) Type() string { return "int" }

// scanAndReport scans loc, prints the report with print, and turns what it
// found into the exit status: corrupted checkpoints (1), with needPick no
// checkpoint that verifies (1), checkpoints only degraded here (2).
func scanAndReport(cmd *cobra.Command, given string, print func(io.Writer, string, *checkpoint.Report) (corrupt, degraded int), needPick bool) error {
	loc, err := location(given)
	if err != nil {
		return err
	}
	// Scan gets "{host}" unexpanded: it checks the other hosts' copies of
	// a replicated checkpoint in the directories beside this one.
	r, err := checkpoint.Scan(given)
	if err != nil {
		return err
	}
	corrupt, degraded := print(cmd.OutOrStdout(), loc, r)
	switch {
	case corrupt > 0:
		return fmt.Errorf("%d committed checkpoint(s) in %s are corrupted", corrupt, loc)
	case needPick && r.Pick < 0:
		return fmt.Errorf("no committed checkpoint in %s verifies: %s", loc, r.Reason)
	case degraded > 0:
		return degradedError(cmd.ErrOrStderr(), degraded, loc)
	}
	return nil
}
