package checkpoint

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A replicated checkpoint's other copies, as Scan sees them from one
// host's directory. Scan of a location with "{host}" looks for the other
// hosts' directories beside this one (the location with any name for
// {host}: on a shared filesystem, or with the hosts' disks mounted side by
// side) and checks there the copies a restore would read; the copies it
// cannot reach are said to be unchecked, never taken as good from the
// manifest alone.

// peerDirs are the directories of a "{host}" location other than this
// host's; nil when the location has no "{host}".
type peerDirs []string

// findPeers lists the existing directories that match loc, a location
// with "{host}", but own (this host's, expanded).
func findPeers(loc, own string) peerDirs {
	if !strings.Contains(loc, "{host}") || IsRemote(loc) {
		return nil
	}
	parts := strings.Split(loc, "{host}")
	for i, p := range parts {
		parts[i] = globEscape(p)
	}
	matches, _ := filepath.Glob(strings.Join(parts, "*")) // the pattern is well formed
	peers := peerDirs{}
	for _, d := range matches {
		if st, err := os.Stat(d); err == nil && st.IsDir() && filepath.Clean(d) != filepath.Clean(own) {
			peers = append(peers, d)
		}
	}
	return peers
}

// globEscape quotes the characters filepath.Match treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// copies finds, among the peers, the other hosts' copies of the
// checkpoint whose manifest (this host's copy) is man: the directories
// that hold a manifest of the same step, files and checksums, by the host
// their manifest says they are.
func (p peerDirs) copies(ctx context.Context, man *Manifest) map[int]string {
	out := map[int]string{}
	for _, d := range p {
		pm, err := storeReadManifest(ctx, DirStore(d), man.Step)
		if err != nil || !sameCheckpoint(man, pm) || pm.Host == man.Host {
			continue
		}
		if _, dup := out[pm.Host]; !dup {
			out[pm.Host] = d
		}
	}
	return out
}

// sameCheckpoint says whether two hosts' manifests are copies of one
// save's: the same step, placement and files.
func sameCheckpoint(a, b *Manifest) bool {
	if a.Step != b.Step || a.WorldSize != b.WorldSize || a.Hosts != b.Hosts || a.TotalBytes != b.TotalBytes {
		return false
	}
	fa, fb := a.Files(), b.Files()
	return slices.EqualFunc(fa, fb, func(x, y FileInfo) bool { return x.File == y.File && x.Size == y.Size && x.SHA256 == y.SHA256 })
}

// elsewhere is what the other copies of one file came to.
type elsewhere struct {
	good      string   // a directory whose copy verifies; "" for none
	bad       []string // "missing in DIR", for the copies that do not verify (copyProblem)
	unchecked []int    // the hosts whose copies were not checked (no directory of theirs found)
}

// checkElsewhere checks the copies of f on hosts (the other hosts that
// keep it), at the directories in dirs (by host), until one verifies.
func checkElsewhere(ctx context.Context, step int64, f FileInfo, hosts []int, dirs map[int]string) elsewhere {
	var out elsewhere
	for _, h := range hosts {
		d, ok := dirs[h]
		if !ok {
			out.unchecked = append(out.unchecked, h)
			continue
		}
		err := storeCheckFile(ctx, DirStore(d), step, f, io.Discard)
		if err == nil {
			out.good = d
			return out
		}
		out.bad = append(out.bad, copyProblem(err, f, "in "+d))
	}
	return out
}

// copyProblem says what is wrong with the copy of f at where ("here", "in
// DIR"), from the error of checking it: "missing in DIR", "in DIR it is 4
// bytes, manifest says 58 (truncated or overwritten)".
func copyProblem(err error, f FileInfo, where string) string {
	if errors.Is(err, fs.ErrNotExist) {
		return "missing " + where
	}
	text := err.Error()
	if rest, ok := strings.CutPrefix(text, f.File+" "); ok {
		return where + " it " + rest
	}
	return where + ": " + strings.TrimPrefix(text, f.File+": ")
}
