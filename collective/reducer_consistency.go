package collective

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
)

// Keeping a Reducer's replicas identical: BroadcastParameters copies the
// parameters from one rank to all, and CheckConsistency finds replicas
// whose parameters have diverged, and names them.

// BroadcastParameters copies every registered parameter from rank root to
// all ranks, so that every replica starts identical.
func (r *Reducer) BroadcastParameters(ctx context.Context, root int) error {
	if err := r.Seal(ctx); err != nil {
		return err
	}
	var hs []*Handle
	for _, e := range r.entries {
		if e.param != nil {
			hs = append(hs, r.comm.BroadcastAsync(ctx, e.param, root, Name(e.name)))
		}
	}
	var errs []error
	for _, h := range hs {
		errs = append(errs, h.Wait(ctx))
	}
	return errors.Join(errs...)
}

// CheckConsistency hashes every registered parameter and compares the
// hashes across ranks. If replicas have diverged it returns, on every rank,
// an error naming the first tensor that differs and the ranks that differ.
func (r *Reducer) CheckConsistency(ctx context.Context) error {
	if err := r.Seal(ctx); err != nil {
		return err
	}
	var idx []int
	for i, e := range r.entries {
		if e.param != nil {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	mine := make([]int64, len(idx))
	for j, i := range idx {
		h := fnv.New64a()
		h.Write(r.entries[i].pv.bytes)
		mine[j] = int64(h.Sum64())
	}
	n := r.comm.Size()
	all := make([]int64, len(mine)*n)
	if err := r.comm.Allgather(ctx, mine, all, Name("parameter hashes")); err != nil {
		return err
	}
	p := len(idx)
	odd := map[int][]string{} // rank -> tensors where it is outside the majority
	first := ""
	for j, i := range idx {
		groups := map[int64][]int{}
		for rk := range n {
			h := all[rk*p+j]
			groups[h] = append(groups[h], rk)
		}
		if len(groups) == 1 {
			continue
		}
		var keys []int64
		for h := range groups {
			keys = append(keys, h)
		}
		// Majority first; ties go to the group holding the lowest rank.
		slices.SortFunc(keys, func(a, b int64) int {
			if d := len(groups[b]) - len(groups[a]); d != 0 {
				return d
			}
			return groups[a][0] - groups[b][0]
		})
		name := r.entries[i].name
		if first == "" {
			var parts []string
			for _, h := range keys {
				parts = append(parts, fmt.Sprintf("%s hash %016x", ranksString(groups[h]), uint64(h)))
			}
			first = fmt.Sprintf("first differing tensor %q (#%d): %s", name, i, strings.Join(parts, "; "))
		}
		for _, h := range keys[1:] {
			for _, rk := range groups[h] {
				odd[rk] = append(odd[rk], name)
			}
		}
	}
	if first == "" {
		return nil
	}
	var ranks []int
	for rk := range odd {
		ranks = append(ranks, rk)
	}
	slices.Sort(ranks)
	var parts []string
	for _, rk := range ranks {
		parts = append(parts, fmt.Sprintf("rank %d (%d tensors, first %q)", rk, len(odd[rk]), odd[rk][0]))
	}
	return fmt.Errorf("gorun: parameters have diverged across ranks: %s; ranks outside the majority: %s", first, strings.Join(parts, ", "))
}

func ranksString(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = strconv.Itoa(r)
	}
	if len(rs) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ",")
}
