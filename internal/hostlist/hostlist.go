// Package hostlist expands Slurm's compressed host lists and task counts.
//
// Slurm hands a job step its nodes as one compressed string
// (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST): "node[01-03,07]" is node01,
// node02, node03 and node07. A range keeps the zero padding of its first
// number ("[08-10]" is 08 09 10, "[8-10]" is 8 9 10), one bracket may hold
// several ranges and single numbers, top-level commas separate names
// ("a[1-2],b3"), and a name with several bracket groups ("rack[1-2]-n[1-2]")
// is their cartesian product with the first group varying slowest, the order
// Slurm itself uses. The tasks per node (SLURM_STEP_TASKS_PER_NODE) are
// compressed as counts with repetitions: "2(x3),1" is 2 2 2 1.
//
// Expansion is capped at MaxNames names so that a malformed or hostile
// string ("n[0-999999999999]") fails with an error instead of exhausting
// memory.
package hostlist

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxNames bounds the number of names (or counts) one list may expand to.
// Slurm's largest clusters have a few hundred thousand nodes.
const MaxNames = 1 << 20

// Expand returns the host names of a Slurm host list, in Slurm's order,
// duplicates kept. An empty list, unbalanced or nested brackets, an empty
// name or range, a reversed range ("n[3-1]"), a non-numeric range and a list
// of more than MaxNames names are errors that quote the list.
func Expand(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, errors.New("hostlist: empty host list")
	}
	items, err := splitTop(list)
	if err != nil {
		return nil, fmt.Errorf("hostlist %q: %w", list, err)
	}
	var out []string
	for _, item := range items {
		if item == "" {
			return nil, fmt.Errorf("hostlist %q: empty host name (two commas in a row, or a comma at an end)", list)
		}
		names, err := expandName(item, MaxNames-len(out))
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", list, err)
		}
		out = append(out, names...)
	}
	return out, nil
}

// splitTop splits list at the commas outside brackets and checks that
// brackets are balanced and not nested.
func splitTop(list string) ([]string, error) {
	var items []string
	depth, start := 0, 0
	for i, c := range list {
		switch c {
		case '[':
			if depth > 0 {
				return nil, fmt.Errorf("nested '[' at offset %d", i)
			}
			depth++
		case ']':
			if depth == 0 {
				return nil, fmt.Errorf("']' without '[' at offset %d", i)
			}
			depth--
		case ',':
			if depth == 0 {
				items = append(items, strings.TrimSpace(list[start:i]))
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, errors.New("'[' without ']'")
	}
	return append(items, strings.TrimSpace(list[start:])), nil
}

// expandName expands one name with zero or more bracket groups into at most
// limit names. Every group is parsed and counted before any name is made, so
// an oversized list fails at once.
func expandName(name string, limit int) ([]string, error) {
	// Split into literal text and bracket groups: literals[0] [g0] literals[1] [g1] ...
	var literals []string
	var groups [][]numRange
	total := 1
	rest := name
	for {
		open := strings.IndexByte(rest, '[')
		if open < 0 {
			literals = append(literals, rest)
			break
		}
		closing := strings.IndexByte(rest, ']') // balanced and unnested: after open
		literals = append(literals, rest[:open])
		ranges, count, err := parseRanges(rest[open+1:closing], limit)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", name, err)
		}
		if count > limit/total {
			return nil, fmt.Errorf("%q expands to more than %d names", name, MaxNames)
		}
		total *= count
		groups = append(groups, ranges)
		rest = rest[closing+1:]
	}
	if total > limit {
		return nil, fmt.Errorf("more than %d names", MaxNames)
	}
	values := make([][]string, len(groups))
	for i, ranges := range groups {
		for _, r := range ranges {
			for v := r.lo; ; v++ {
				values[i] = append(values[i], fmt.Sprintf("%0*d", r.width, v))
				if v == r.hi {
					break
				}
			}
		}
	}
	// Cartesian product, last group varying fastest.
	out := make([]string, 0, total)
	idx := make([]int, len(values))
	var b strings.Builder
	for {
		b.Reset()
		for i, g := range values {
			b.WriteString(literals[i])
			b.WriteString(g[idx[i]])
		}
		b.WriteString(literals[len(values)])
		out = append(out, b.String())
		i := len(values) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(values[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return out, nil
		}
	}
}

// numRange is lo..hi, each number written with at least width digits.
type numRange struct {
	lo, hi uint64
	width  int
}

// parseRanges parses the inside of one bracket ("01-03,07") and counts its
// numbers, failing once there are more than limit.
func parseRanges(s string, limit int) ([]numRange, int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, 0, errors.New("empty brackets")
	}
	var out []numRange
	count := 0
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		loText, hiText, isRange := strings.Cut(r, "-")
		lo, err := parseNumber(loText, r)
		if err != nil {
			return nil, 0, err
		}
		hi := lo
		if isRange {
			if hi, err = parseNumber(hiText, r); err != nil {
				return nil, 0, err
			}
			if hi < lo {
				return nil, 0, fmt.Errorf("range %q is reversed (write %s-%s)", r, hiText, loText)
			}
		}
		if hi-lo >= uint64(limit-count) {
			return nil, 0, fmt.Errorf("range %q: more than %d names", r, MaxNames)
		}
		count += int(hi-lo) + 1
		// Slurm pads every number to the width of the range's first one.
		out = append(out, numRange{lo, hi, len(loText)})
	}
	return out, count, nil
}

func parseNumber(text, r string) (uint64, error) {
	if text == "" {
		return 0, fmt.Errorf("range %q: missing number", r)
	}
	for _, c := range text {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("range %q: %q is not a number", r, text)
		}
	}
	v, err := strconv.ParseUint(text, 10, 63)
	if err != nil {
		return 0, fmt.Errorf("range %q: %q is too large", r, text)
	}
	return v, nil
}

// ExpandCounts expands Slurm's compressed task counts, as in
// SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE: comma-separated
// counts, each optionally followed by "(xN)" to repeat it N times, so
// "2(x3),1" is [2 2 2 1]. The counts are non-negative; more than MaxNames
// entries is an error.
func ExpandCounts(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("hostlist: empty task count list")
	}
	var out []int
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		countText, repeatText, hasRepeat := strings.Cut(item, "(")
		count, err := strconv.Atoi(countText)
		if err != nil || count < 0 {
			return nil, fmt.Errorf("hostlist: task counts %q: %q is not a count (want N or N(xM), e.g. 2(x3),1)", s, item)
		}
		repeat := 1
		if hasRepeat {
			inner, ok := strings.CutPrefix(repeatText, "x")
			inner, closed := strings.CutSuffix(inner, ")")
			if !ok || !closed {
				return nil, fmt.Errorf("hostlist: task counts %q: %q: want N(xM)", s, item)
			}
			repeat, err = strconv.Atoi(inner)
			if err != nil || repeat < 1 {
				return nil, fmt.Errorf("hostlist: task counts %q: %q: repetition must be a positive integer", s, item)
			}
		}
		if repeat > MaxNames-len(out) {
			return nil, fmt.Errorf("hostlist: task counts %q expand to more than %d entries", s, MaxNames)
		}
		for range repeat {
			out = append(out, count)
		}
	}
	return out, nil
}
