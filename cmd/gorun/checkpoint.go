package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gorun/gorun/checkpoint"
)

func newCheckpointCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Look at the barrier checkpoints a job wrote (see package checkpoint)",
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

DIR may be s3://bucket/prefix, with the AWS environment described in
package checkpoint (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
AWS_PROFILE, AWS_ENDPOINT_URL, AWS_S3_FORCE_PATH_STYLE=true); the bucket
must exist.`,
		Example:       "  gorun checkpoint inspect /shared/ckpt\n  AWS_ENDPOINT_URL=http://127.0.0.1:7070 AWS_S3_FORCE_PATH_STYLE=true gorun checkpoint inspect s3://ckpt/job1",
		Args:          cobra.ExactArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := checkpoint.Scan(args[0])
			if err != nil {
				return err
			}
			if corrupt := printReport(cmd.OutOrStdout(), args[0], r); corrupt > 0 {
				return fmt.Errorf("%d committed checkpoint(s) in %s are corrupted", corrupt, args[0])
			}
			return nil
		},
	}
	cmd.AddCommand(inspect)
	return cmd
}

func printReport(w io.Writer, dir string, r *checkpoint.Report) (corrupt int) {
	if len(r.Entries) == 0 {
		fmt.Fprintf(w, "no checkpoints in %s\n", dir)
	}
	for _, e := range r.Entries {
		status := "ok (checksums verified)"
		switch {
		case !e.Committed:
			status = strings.Replace(e.Problem, "not committed", "NOT COMMITTED", 1)
		case e.Problem != "":
			status = "CORRUPTED: " + strings.TrimPrefix(e.Problem, "corrupted: ")
			corrupt++
		}
		fmt.Fprintf(w, "step %d  %s\n", e.Step, e.Dir)
		fmt.Fprintf(w, "  status: %s\n", status)
		if m := e.Manifest; m != nil {
			fmt.Fprintf(w, "  world size %d, %d bytes of tensors, %d bytes on disk in %d files\n",
				m.WorldSize, m.TotalBytes, m.Size(), len(m.Shards)+len(m.Blobs))
			for _, t := range m.Tensors {
				fmt.Fprintf(w, "  tensor %-20s %-8s shape %v (%d bytes)\n", t.Name, t.DType, t.Shape, t.Bytes)
			}
			if len(m.Blobs) > 0 && len(m.Blobs[0].Blobs) > 0 {
				fmt.Fprintf(w, "  per-rank state: %s\n", strings.Join(m.Blobs[0].Blobs, ", "))
			}
		}
	}
	if r.Pick >= 0 {
		fmt.Fprintf(w, "restore would pick step %d: %s\n", r.Pick, r.Reason)
	} else {
		fmt.Fprintf(w, "restore would pick nothing: %s\n", r.Reason)
	}
	return corrupt
}
