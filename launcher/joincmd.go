// Ranks started by hand that join an elastic job: the job key file and
// the command gorun prints for them.

package launcher

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/p2p"
)

// logJoinCommand prints, with --job-key-file, the command that starts a
// rank by hand that joins this job.
func (e *elasticRun) logJoinCommand() {
	job, el := e.job, e.el
	if el.JobKeyFile == "" {
		if job.Verbose {
			job.Logf("give --job-key-file FILE to let ranks started by hand join this job")
		}
		return
	}
	vars := []string{
		collective.EnvElastic + "=1",
		collective.EnvRank + "=-1",
		collective.EnvSize + "=" + strconv.Itoa(job.NP),
	}
	if el.Etcd != nil {
		// The joiner finds the leader in etcd: it needs neither gorun
		// nor its address.
		vars = append(vars, e.etcdEnv()...)
	} else {
		vars = append(vars, collective.EnvRendezvous+"="+e.rdv.Addr())
	}
	vars = append(vars,
		collective.EnvJobKeyFile+"="+el.JobKeyFile,
		collective.EnvHeartbeatTimeout+"="+el.HeartbeatTimeout.String(),
	)
	if job.Timeout > 0 {
		vars = append(vars, collective.EnvTimeout+"="+job.Timeout.String())
	}
	if e.number > 0 {
		vars = append(vars, collective.EnvRestartCount+"="+strconv.Itoa(e.number))
	}
	job.Logf("to add a rank by hand (it joins at the next commit boundary, up to --max-np %s): %s",
		maxNPText(el), joinCommand(vars, job.Env, job.Program, job.Args))
}

// jobKeyFile reads the job key from path, or creates path (mode 0600)
// with a new one.
func jobKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key := p2p.NewJobKey()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("--job-key-file: %w", err)
		}
		_, err = fmt.Fprintln(f, hex.EncodeToString(key))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("--job-key-file: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--job-key-file: %w", err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--job-key-file %s is readable by others (mode %v): chmod 600 %s", path, st.Mode().Perm(), path)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < 16 {
		return nil, fmt.Errorf("--job-key-file %s does not hold a hex key of at least 32 digits: remove it and gorun writes a new one", path)
	}
	return key, nil
}

// gorunSets are the variables gorun sets for every rank of an elastic job
// after the job's -x variables (Job.Env), so that gorun's values win.
var gorunSets = []string{collective.EnvElastic, collective.EnvRank, collective.EnvSize, collective.EnvRendezvous,
	collective.EnvJobKey, collective.EnvJobKeyFile, collective.EnvHeartbeatTimeout, collective.EnvRestartCount,
	collective.EnvLocalRank, collective.EnvLocalSize, collective.EnvHost, EnvProcID,
	collective.EnvRdzvBackend, collective.EnvRdzvEndpoints, collective.EnvRdzvID, collective.EnvRdzvConf}

// joinCommand is the shell command that starts a rank by hand as the job's
// ranks are started: vars (gorun's GORUN_* for a joiner), then the job's
// -x variables (env) but those gorun sets itself (vars, gorunSets: the
// ranks get gorun's values), then the program and its arguments, each
// word quoted for a POSIX shell where it needs to be. A variable whose name
// the shell does not take in an assignment (FOO.BAR) is passed by env(1).
func joinCommand(vars, env []string, program string, args []string) string {
	set := map[string]bool{}
	for _, name := range gorunSets {
		set[name] = true
	}
	for _, v := range vars {
		name, _, _ := strings.Cut(v, "=")
		set[name] = true
	}
	all := slices.Clone(vars)
	for _, v := range env {
		if name, _, _ := strings.Cut(v, "="); !set[name] {
			all = append(all, v)
		}
	}
	var words []string
	useEnv := false
	for _, v := range all {
		name, value, _ := strings.Cut(v, "=")
		if shellName(name) {
			words = append(words, name+"="+shellQuote(value))
		} else {
			words, useEnv = append(words, shellQuote(v)), true
		}
	}
	if useEnv {
		words = append([]string{"env"}, words...)
	}
	prog := shellQuote(program)
	if strings.Contains(prog, "=") && !strings.HasPrefix(prog, "'") {
		// The shell would take NAME=VALUE there for an assignment.
		prog = "'" + prog + "'"
	}
	words = append(words, prog)
	for _, a := range args {
		words = append(words, shellQuote(a))
	}
	return strings.Join(words, " ")
}

// shellName says whether name can be assigned in a POSIX shell command
// (NAME=value cmd): letters, digits and _, not starting with a digit.
func shellName(name string) bool {
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	return !strings.ContainsFunc(name, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
}

// shellQuote quotes s as one word for a POSIX shell, only if it needs it:
// a word of letters, digits and @%+=:,./_- is left as it is; any other
// (with a space, a quote, $, ~, *, [, ...), or the empty word, is put in
// single quotes, each ' in it closing them, escaped (\') and opening them
// again.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
