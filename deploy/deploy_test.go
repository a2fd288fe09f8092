package deploy_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/gorun/gorun/launcher"
)

// Every manifest parses, and every document names its API and kind.
func TestManifestsParse(t *testing.T) {
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"elastic-indexed-job.yaml", "elastic-pytorchjob.yaml", "indexed-job.yaml", "jobset.yaml", "mpijob.yaml", "pytorchjob.yaml", "trainjob.yaml"}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		for i, d := range readDocs(t, f) {
			if d["apiVersion"] == nil || d["kind"] == nil || d["metadata"] == nil {
				t.Errorf("%s document %d: no apiVersion, kind or metadata", f, i)
			}
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("manifests %v, want %v", names, want)
	}
}

func readDocs(t *testing.T, file string) []map[string]any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs []map[string]any
	dec := yaml.NewDecoder(f)
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
}

func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// The MPIJob's launcher runs gorun --hostfile on the hostfile the
// mpi-operator mounts, and gorun's reader takes that file as the operator
// writes it. The operator's contract (mpi-operator v2, pkg/controller,
// newConfigMap, OpenMPI): /etc/mpi/hostfile has one line per worker,
// "<job>-worker-<i>.<job>.<namespace>.svc slots=<slotsPerWorker>".
func TestMPIJobHostfile(t *testing.T) {
	docs := readDocs(t, "kubernetes/mpijob.yaml")
	if len(docs) != 1 || docs[0]["kind"] != "MPIJob" {
		t.Fatalf("mpijob.yaml: want one MPIJob, got %d documents", len(docs))
	}
	job := docs[0]
	name, _ := at(job, "metadata", "name").(string)
	slots, ok1 := at(job, "spec", "slotsPerWorker").(int)
	workers, ok2 := at(job, "spec", "mpiReplicaSpecs", "Worker", "replicas").(int)
	if name == "" || !ok1 || !ok2 || slots < 1 || workers < 1 {
		t.Fatalf("mpijob.yaml: name %q, slotsPerWorker %v, worker replicas %v", name, at(job, "spec", "slotsPerWorker"), at(job, "spec", "mpiReplicaSpecs", "Worker", "replicas"))
	}
	cmd, _ := at(job, "spec", "mpiReplicaSpecs", "Launcher", "template", "spec", "containers", 0, "command").([]any)
	var args []string
	for _, a := range cmd {
		args = append(args, fmt.Sprint(a))
	}
	if len(args) < 4 || args[0] != "gorun" || args[1] != "--hostfile" || args[2] != "/etc/mpi/hostfile" {
		t.Fatalf("launcher command %q: want gorun --hostfile /etc/mpi/hostfile PROGRAM ...", args)
	}

	var hostfile strings.Builder
	var want []launcher.Host
	for i := range workers {
		host := fmt.Sprintf("%s-worker-%d.%s.%s.svc", name, i, name, "team-a")
		fmt.Fprintf(&hostfile, "%s slots=%d\n", host, slots)
		want = append(want, launcher.Host{Name: host, Slots: slots})
	}
	path := filepath.Join(t.TempDir(), "hostfile")
	if err := os.WriteFile(path, []byte(hostfile.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := launcher.ParseHostfile(path)
	if err != nil {
		t.Fatalf("gorun's hostfile reader on the mpi-operator's hostfile:\n%s%v", hostfile.String(), err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("ParseHostfile = %v, want %v", got, want)
	}
	// With runLauncherAsWorker the operator lists the launcher first as
	// "localhost slots=N"; gorun runs those ranks directly.
	if err := os.WriteFile(path, []byte(fmt.Sprintf("localhost slots=%d\n%s", slots, hostfile.String())), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := launcher.ParseHostfile(path); err != nil || len(got) != workers+1 || got[0].Name != "localhost" {
		t.Errorf("hostfile with the launcher as a worker: %v, %v", got, err)
	}
}

// srun.sh makes a fresh key file only its owner can read, runs srun -N 2
// -n 4 with GORUN_JOB_KEY_FILE naming it, and removes it afterwards. A stub
// srun records what it was given.
func TestSrunScript(t *testing.T) {
	for _, tool := range []string{"sh", "od", "tr", "mktemp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
	dir := t.TempDir()
	home, bin := filepath.Join(dir, "home"), filepath.Join(dir, "bin")
	for _, d := range []string{home, bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	record := filepath.Join(dir, "srun.record")
	stub := `#!/bin/sh
{
  echo "args: $*"
  echo "keyfile: $GORUN_JOB_KEY_FILE"
  echo "mode: $(stat -c %a "$GORUN_JOB_KEY_FILE")"
  echo "key: $(cat "$GORUN_JOB_KEY_FILE")"
} >` + record + "\nexit 3\n"
	if err := os.WriteFile(filepath.Join(bin, "srun"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "slurm/srun.sh", "--epochs", "2")
	cmd.Env = append(os.Environ(), "HOME="+home, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
		t.Fatalf("srun.sh: %v (want srun's exit status 3)\n%s", err, out)
	}
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatalf("srun was not run: %v\n%s", err, out)
	}
	rec := string(b)
	for _, re := range []string{
		`(?m)^args: -N 2 -n 4 \./train --epochs 2$`,
		`(?m)^keyfile: ` + regexp.QuoteMeta(home) + `/\.gorun-job-key\.\S+$`,
		`(?m)^mode: 600$`,
		`(?m)^key: [0-9a-f]{64}$`,
	} {
		if !regexp.MustCompile(re).MatchString(rec) {
			t.Errorf("srun saw:\n%s\nwant a line matching %s", rec, re)
		}
	}
	left, err := filepath.Glob(filepath.Join(home, ".gorun-job-key.*"))
	if err != nil || len(left) != 0 {
		t.Errorf("key files left behind: %v %v", left, err)
	}
}

// train.sbatch asks for an allocation and runs gorun in it.
func TestSbatchScript(t *testing.T) {
	b, err := os.ReadFile("slurm/train.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, re := range []string{`(?m)^#!/bin/bash$`, `(?m)^#SBATCH --nodes=\d+$`, `(?m)^#SBATCH --ntasks-per-node=\d+$`, `(?m)^gorun \./train\b`} {
		if !regexp.MustCompile(re).MatchString(s) {
			t.Errorf("train.sbatch has no line matching %s", re)
		}
	}
	if _, err := exec.LookPath("bash"); err == nil {
		if out, err := exec.Command("bash", "-n", "slurm/train.sbatch").CombinedOutput(); err != nil {
			t.Errorf("bash -n train.sbatch: %v\n%s", err, out)
		}
	}
}
