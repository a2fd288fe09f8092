package launcher

// What gorun doctor (internal/doctor) shares with the launcher: it reaches
// the hosts exactly as a job's remote ranks are reached, ssh or srun, with
// the same flags and quoting.

// Args are the arguments of Client that run a shell command line, given
// as one more argument, on host: ssh's, or srun's when s.Srun is set.
func (s SSH) Args(host string) []string { return s.args(host) }

// CheckArgs are Args for a short session that must say why it cannot
// start: under srun, srun's errors are kept and the step gives up when the
// allocation cannot start it within ConnectTimeout; with ssh, Args.
func (s SSH) CheckArgs(host string) []string { return s.checkArgs(host) }

// Client is the program Args are for: ssh (or s.Command), or srun.
func (s SSH) Client() string { return s.command() }

// Via names how remote hosts are reached, "ssh" or "srun", for messages.
func (s SSH) Via() string { return s.via() }

// ShellQuote quotes s for a POSIX shell, leaving plain words as they are.
func ShellQuote(s string) string { return shquote(s) }

// SeenAddrs is what a session to a remote host saw of its connection:
// the client's and the server's address in $SSH_CONNECTION (or srun's
// equivalent).
type SeenAddrs struct{ Host, ClientIP, ServerIP string }

// LauncherIP is the address a job's rendezvous would listen on, chosen as
// a job chooses it (chooseLauncherIP) from what the sessions to the remote
// hosts saw, in host order, and why.
func LauncherIP(seen []SeenAddrs, via string) (ip, why string, err error) {
	infos := make(map[string]sshInfo, len(seen))
	order := make([]string, len(seen))
	for i, s := range seen {
		infos[s.Host] = sshInfo{clientIP: s.ClientIP, serverIP: s.ServerIP, via: via}
		order[i] = s.Host
	}
	return chooseLauncherIP(infos, order)
}
