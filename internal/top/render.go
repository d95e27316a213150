package top

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
)

// Thresholds of the colours: a 99th percentile of repeat ages past
// p99Warn of W is yellow, past p99Bad red: repeats that come later than
// W are forwarded again.
const (
	p99Warn = 0.5
	p99Bad  = 0.9
)

// Colour reports whether top colours its output: on a terminal, unless
// $NO_COLOR is set to anything (no-color.org).
func Colour(getenv func(string) string, terminal bool) bool {
	return terminal && getenv("NO_COLOR") == ""
}

// Styles are the styles a frame is rendered with.
type Styles struct {
	header, title, bad, warn, good, dim lipgloss.Style
}

// NewStyles returns the styles of w: coloured when colour is true (with
// the colours w's terminal supports), else plain text, with no escape
// sequence at all.
func NewStyles(w io.Writer, colour bool) Styles {
	r := lipgloss.NewRenderer(w)
	if !colour {
		r.SetColorProfile(termenv.Ascii)
	} else if r.ColorProfile() == termenv.Ascii {
		r.SetColorProfile(termenv.ANSI)
	}
	return Styles{
		header: r.NewStyle().Bold(true).Underline(true),
		title:  r.NewStyle().Bold(true),
		bad:    r.NewStyle().Foreground(lipgloss.Color("1")).Bold(true),
		warn:   r.NewStyle().Foreground(lipgloss.Color("3")),
		good:   r.NewStyle().Foreground(lipgloss.Color("2")),
		dim:    r.NewStyle().Faint(true),
	}
}

// Header is the frame's first line: what is shown, and when.
type Header struct {
	// Subject is the admin service's subject prefix asked.
	Subject string
	// Interval is the time between refreshes.
	Interval time.Duration
}

// Render renders f sorted by s as text: a title line, the instances'
// table, the partitions' table, and with keys, the keys' help.
func Render(f Frame, h Header, s Sort, st Styles, keys bool) string {
	var b strings.Builder
	title := fmt.Sprintf("dedupe-stage top  %s  %d instance(s), %d partition(s)", h.Subject, countAnswered(f.Instances), len(f.Partitions))
	if f.Window > 0 {
		title += "  W " + f.Window.String()
	}
	title += fmt.Sprintf("  every %s  sorted by %s %s  %s", h.Interval, s.By, arrow(s.Desc), f.At.UTC().Format("15:04:05Z"))
	b.WriteString(st.title.Render(title) + "\n")
	if f.Err != nil {
		b.WriteString(st.bad.Render("error: "+f.Err.Error()) + "\n")
	}
	b.WriteString("\n")
	b.WriteString(instancesTable(f, s, st).render(st))
	b.WriteString("\n")
	b.WriteString(partitionsTable(f, s, st).render(st))
	if keys {
		b.WriteString("\n" + st.dim.Render("s/→ next column  S/← previous  1-7 column  r reverse  q quit") + "\n")
	}
	return b.String()
}

func countAnswered(rows []InstanceRow) int {
	n := 0
	for _, r := range rows {
		if r.Answered {
			n++
		}
	}
	return n
}

func arrow(desc bool) string {
	if desc {
		return "↓"
	}
	return "↑"
}

// cell is one table cell: its text and its style.
type cell struct {
	text  string
	style *lipgloss.Style // nil: plain
}

// table is a table of cells; right marks the columns aligned right.
type table struct {
	head  []string
	right []bool
	rows  [][]cell
}

// render writes t with its columns padded to their widest cell (the
// padding outside the styles, so that escapes never shift a column).
func (t table) render(st Styles) string {
	width := make([]int, len(t.head))
	for i, h := range t.head {
		width[i] = lipgloss.Width(h)
	}
	for _, r := range t.rows {
		for i, c := range r {
			width[i] = max(width[i], lipgloss.Width(c.text))
		}
	}
	var b strings.Builder
	line := func(cells []cell) {
		var l strings.Builder
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-lipgloss.Width(c.text))
			text := c.text
			if c.style != nil {
				text = c.style.Render(text)
			}
			if i > 0 {
				l.WriteString("  ")
			}
			switch {
			case t.right[i]:
				l.WriteString(pad + text)
			case i < len(cells)-1:
				l.WriteString(text + pad)
			default:
				l.WriteString(text)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	head := make([]cell, len(t.head))
	for i, h := range t.head {
		head[i] = cell{h, &st.header}
	}
	line(head)
	for _, r := range t.rows {
		line(r)
	}
	return b.String()
}

// sortMark marks the header of the column the rows are sorted by.
func sortMark(head []string, at int, s Sort) []string {
	if at >= 0 {
		head[at] += arrow(s.Desc)
	}
	return head
}

// instancesTable is the table of the instances.
func instancesTable(f Frame, s Sort, st Styles) table {
	t := table{
		head:  []string{"INSTANCE", "STATE", "NATS", "OWNS", "RATE/S", "JUDGED", "REPEAT%", "P99_AGE/W", "DEAD_LETTERS", "PENDING", "ACK_PENDING", "RESTORING"},
		right: []bool{false, false, false, false, true, true, true, false, false, true, true, false},
	}
	t.head = sortMark(t.head, []int{0, 4, 5, 6, 7, 8, 9}[s.By], s)
	for _, r := range f.Instances {
		state := cell{"ready", &st.good}
		switch {
		case !r.Answered:
			state = cell{"no answer", &st.bad}
		case r.Problem != "":
			state = cell{"failing: " + r.Problem, &st.bad}
		case len(r.Restoring) > 0:
			state = cell{"restoring", &st.warn}
		case !r.Ready:
			state = cell{"starting", &st.warn}
		}
		t.rows = append(t.rows, []cell{
			{r.Instance, nil}, state, natsCell(r.NATS, st), {ints(r.Owned), nil},
			{rateText(r.Rate), nil}, {strconv.FormatUint(r.Judged, 10), nil}, shareCell(r.RepeatShare()),
			p99Cell(r, st), deadCell(r.DeadLetters, st), pendingCell(r.Backlog, false), pendingCell(r.Backlog, true), restoringCell(r.Restoring, st),
		})
	}
	return t
}

// partitionsTable is the table of the partitions.
func partitionsTable(f Frame, s Sort, st Styles) table {
	t := table{
		head:  []string{"PARTITION", "OWNER", "RATE/S", "JUDGED", "NEW", "REPEATS", "REPEAT%", "STALE", "DEAD", "PENDING", "ACK_PENDING", "RESTORING"},
		right: []bool{true, false, true, true, true, true, true, true, true, true, true, false},
	}
	t.head = sortMark(t.head, []int{0, 2, 3, 6, -1, 8, 9}[s.By], s)
	for _, r := range f.Partitions {
		owner := cell{strings.Join(r.Owners, ","), nil}
		if len(r.Owners) == 0 {
			owner = cell{"none", &st.warn}
		}
		restoring := cell{"", nil}
		if r.Restoring != nil {
			restoring = cell{fmt.Sprintf("%d records", *r.Restoring), &st.warn}
		}
		dead := cell{strconv.FormatUint(r.DeadLetters, 10), nil}
		if r.DeadLetters > 0 {
			dead.style = &st.warn
		}
		t.rows = append(t.rows, []cell{
			{strconv.Itoa(r.Partition), nil}, owner, {rateText(r.Rate), nil}, {strconv.FormatUint(r.Judged, 10), nil},
			{strconv.FormatUint(r.New, 10), nil}, {strconv.FormatUint(r.Repeats, 10), nil}, shareCell(r.RepeatShare()),
			{strconv.FormatUint(r.Stale, 10), nil},
			dead, pendingCell(r.Backlog, false), pendingCell(r.Backlog, true), restoring,
		})
	}
	return t
}

func ints(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// rateText is a rate in messages per second; "-" when unknown.
func rateText(r float64) string {
	if r < 0 {
		return "-"
	}
	return strconv.FormatFloat(r, 'f', 1, 64)
}

// shareCell is a share as a percentage; "-" before any message.
func shareCell(v float64, ok bool) cell {
	if !ok {
		return cell{"-", nil}
	}
	return cell{strconv.FormatFloat(100*v, 'f', 1, 64) + "%", nil}
}

func natsCell(n *admin.NATSState, st Styles) cell {
	switch {
	case n == nil:
		return cell{"-", nil}
	case !n.Connected:
		return cell{"down", &st.bad}
	case n.Reconnects > 0:
		return cell{fmt.Sprintf("up (%d reconnects)", n.Reconnects), &st.warn}
	}
	return cell{"up", nil}
}

// p99Cell is the 99th percentile of repeat ages against W, coloured by
// its share of W.
func p99Cell(r InstanceRow, st Styles) cell {
	if r.P99 == nil {
		if r.Window > 0 {
			return cell{"- / " + r.Window.String(), nil}
		}
		return cell{"-", nil}
	}
	share, _ := r.P99OfWindow()
	text := fmt.Sprintf("%s / %s (%.0f%%)", roundAge(*r.P99), r.Window, 100*share)
	switch {
	case share >= p99Bad:
		return cell{text, &st.bad}
	case share >= p99Warn:
		return cell{text, &st.warn}
	}
	return cell{text, &st.good}
}

// roundAge rounds an age for reading: to the millisecond under a
// second, else to the second.
func roundAge(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// deadCell lists dead letters by reason, most first.
func deadCell(by map[string]uint64, st Styles) cell {
	if len(by) == 0 {
		return cell{"0", nil}
	}
	reasons := slices.Sorted(maps.Keys(by))
	slices.SortStableFunc(reasons, func(a, b string) int { return cmp.Compare(by[b], by[a]) })
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s %d", r, by[r])
	}
	return cell{strings.Join(parts, ", "), &st.warn}
}

// pendingCell is a backlog's pending messages, or with ack its
// messages delivered and not acknowledged; "-" when unknown.
func pendingCell(b *admin.Backlog, ack bool) cell {
	switch {
	case b == nil:
		return cell{"-", nil}
	case ack:
		return cell{strconv.FormatUint(b.AckPending, 10), nil}
	}
	return cell{strconv.FormatUint(b.Pending, 10), nil}
}

func restoringCell(m map[int]int, st Styles) cell {
	if len(m) == 0 {
		return cell{"", nil}
	}
	parts := make([]string, 0, len(m))
	for _, p := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("p%d %d records", p, m[p]))
	}
	return cell{strings.Join(parts, ", "), &st.warn}
}
