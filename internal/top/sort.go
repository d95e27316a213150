package top

import (
	"cmp"
	"slices"
	"strings"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
)

// Column is what the rows are sorted by.
type Column int

// The columns the rows sort by, in the order the keys cycle through
// them. A column a table does not have (p99 for partitions) sorts that
// table by name.
const (
	ByName        Column = iota // instance name; partition number
	ByRate                      // messages judged per second
	ByJudged                    // messages judged since start
	ByRepeatShare               // share of repeats
	ByP99                       // 99th percentile of repeat ages against W (instances)
	ByDeadLetters               // dead letters
	ByBacklog                   // pending and ack pending
	columns                     // how many there are
)

// names are the columns' names, for --sort and the header.
var names = [columns]string{"name", "rate", "judged", "repeats", "p99", "dead", "backlog"}

// String returns the column's name.
func (c Column) String() string {
	if c < 0 || c >= columns {
		return "?"
	}
	return names[c]
}

// ColumnNames lists every column's name, in order.
func ColumnNames() []string { return names[:] }

// ParseColumn returns the column named s (as ColumnNames spells it).
func ParseColumn(s string) (Column, bool) {
	i := slices.Index(names[:], strings.ToLower(strings.TrimSpace(s)))
	return Column(i), i >= 0
}

// Sort is the order of the rows: by a column, descending or not. Its
// zero value sorts by name, ascending.
type Sort struct {
	By   Column
	Desc bool
}

// Next returns s sorted by the column after its own (step 1) or before it
// (step -1), descending but for the name.
func (s Sort) Next(step int) Sort {
	c := (int(s.By) + step + int(columns)) % int(columns)
	return Sort{By: Column(c), Desc: c != int(ByName)}
}

// Apply sorts both tables of f, ties by name.
func (s Sort) Apply(f *Frame) {
	slices.SortStableFunc(f.Instances, func(a, b InstanceRow) int {
		return s.order(instanceKey(a, s.By), instanceKey(b, s.By), strings.Compare(a.Instance, b.Instance))
	})
	slices.SortStableFunc(f.Partitions, func(a, b PartitionRow) int {
		return s.order(partitionKey(a, s.By), partitionKey(b, s.By), cmp.Compare(a.Partition, b.Partition))
	})
}

// order compares two keys, reversed when descending; ties go by byName,
// always ascending.
func (s Sort) order(a, b float64, byName int) int {
	c := cmp.Compare(a, b)
	if s.Desc {
		c = -c
	}
	if c != 0 {
		return c
	}
	return byName
}

// instanceKey is r's key for column c; unknown values sort as -1, below
// every known one.
func instanceKey(r InstanceRow, c Column) float64 {
	switch c {
	case ByRate:
		return r.Rate
	case ByJudged:
		return float64(r.Judged)
	case ByRepeatShare:
		return orMinus(r.RepeatShare())
	case ByP99:
		return orMinus(r.P99OfWindow())
	case ByDeadLetters:
		return float64(r.DeadTotal)
	case ByBacklog:
		return backlogKey(r.Backlog)
	}
	return 0
}

// partitionKey is r's key for column c, as instanceKey's.
func partitionKey(r PartitionRow, c Column) float64 {
	switch c {
	case ByRate:
		return r.Rate
	case ByJudged:
		return float64(r.Judged)
	case ByRepeatShare:
		return orMinus(r.RepeatShare())
	case ByDeadLetters:
		return float64(r.DeadLetters)
	case ByBacklog:
		return backlogKey(r.Backlog)
	}
	return 0
}

func orMinus(v float64, ok bool) float64 {
	if !ok {
		return -1
	}
	return v
}

func backlogKey(b *admin.Backlog) float64 {
	if b == nil {
		return -1
	}
	return float64(b.Pending + b.AckPending)
}
