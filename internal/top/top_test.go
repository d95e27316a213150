package top

import (
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// reply is an instance's answer owning owned of 4 partitions, with each
// partition's new and repeat counts at at.
func reply(name string, at time.Time, owned []int, news, repeats [4]uint64) admin.StatusReply {
	tr := &admin.Traffic{At: at, DeadLetters: map[string]uint64{}, NATS: admin.NATSState{Connected: true}}
	for p := range 4 {
		pt := admin.PartitionTraffic{Partition: p, New: news[p], Repeat: repeats[p]}
		tr.Partitions = append(tr.Partitions, pt)
	}
	return admin.StatusReply{Instance: name, InstanceStatus: admin.InstanceStatus{Ready: true, Window: "1h0m0s",
		Partitions: 4, Owned: owned, Traffic: tr}}
}

func sampleOf(at time.Time, replies ...admin.StatusReply) Sample {
	return Sample{At: at, Replies: replies}
}

// TestBuildRatesAndSums builds a frame from two samples two seconds apart:
// an instance's rate is its judged messages' growth per second, a
// partition's the sum over the instances that answered both; a
// partition's counts add up over the instances, its owner is the one
// that says so; an instance that stopped answering is kept, marked; counts
// that went back (a restart) give no rate.
func TestBuildRatesAndSums(t *testing.T) {
	a0 := reply("a", t0, []int{0, 1}, [4]uint64{10, 10, 0, 0}, [4]uint64{0, 0, 0, 0})
	a1 := reply("a", t0.Add(2*time.Second), []int{0, 1}, [4]uint64{30, 20, 0, 0}, [4]uint64{10, 0, 0, 0})
	b0 := reply("b", t0, []int{2, 3}, [4]uint64{0, 0, 5, 5}, [4]uint64{})
	b1 := reply("b", t0.Add(2*time.Second), []int{2, 3}, [4]uint64{0, 0, 9, 5}, [4]uint64{})
	b1.Traffic.DeadLetters["no_key"] = 1
	b1.Traffic.UnpartitionedDeadLetters = 1
	gone := reply("c", t0, nil, [4]uint64{}, [4]uint64{})
	f := Build(sampleOf(t0, a0, b0, gone), sampleOf(t0.Add(2*time.Second), a1, b1))

	if len(f.Instances) != 3 || len(f.Partitions) != 4 || f.Window != time.Hour {
		t.Fatalf("frame has %d instances, %d partitions, W %v; want 3, 4, 1h", len(f.Instances), len(f.Partitions), f.Window)
	}
	in := map[string]InstanceRow{}
	for _, r := range f.Instances {
		in[r.Instance] = r
	}
	// a: 20 -> 60 judged in 2s.
	if r := in["a"]; r.Rate != 20 || r.Judged != 60 || r.Repeats != 10 || !r.Answered {
		t.Errorf("a = rate %v judged %d repeats %d answered %v; want 20/s, 60, 10, true", r.Rate, r.Judged, r.Repeats, r.Answered)
	}
	if share, ok := in["a"].RepeatShare(); !ok || share != 10.0/60 {
		t.Errorf("a's repeat share = %v, %v; want 1/6", share, ok)
	}
	// b: 10 -> 15 judged (with the dead letter before a partition).
	if r := in["b"]; r.Rate != 2.5 || r.Judged != 15 || r.DeadTotal != 1 {
		t.Errorf("b = rate %v judged %d dead %d; want 2.5/s, 15, 1", r.Rate, r.Judged, r.DeadTotal)
	}
	if r := in["c"]; r.Answered || r.Rate != -1 {
		t.Errorf("c, gone, = answered %v rate %v; want not answered, no rate", r.Answered, r.Rate)
	}
	want := []struct {
		owner  string
		rate   float64
		judged uint64
	}{{"a", 15, 40}, {"a", 5, 20}, {"b", 2, 9}, {"b", 0, 5}}
	for p, w := range want {
		r := f.Partitions[p]
		if r.Partition != p || strings.Join(r.Owners, ",") != w.owner || r.Rate != w.rate || r.Judged != w.judged {
			t.Errorf("partition %d = %+v; want owner %s, rate %v, judged %d", p, r, w.owner, w.rate, w.judged)
		}
	}

	// a restarted: its counts went back, so no rate.
	a2 := reply("a", t0.Add(4*time.Second), []int{0, 1}, [4]uint64{1, 0, 0, 0}, [4]uint64{})
	f = Build(sampleOf(t0, a1), sampleOf(t0.Add(4*time.Second), a2))
	if f.Instances[0].Rate != -1 || f.Partitions[0].Rate != -1 || f.Partitions[2].Rate != 0 {
		t.Errorf("after a restart: instance rate %v, partition 0 rate %v, partition 2 rate %v; want -1, -1, 0",
			f.Instances[0].Rate, f.Partitions[0].Rate, f.Partitions[2].Rate)
	}
	// One sample: no rate at all.
	f = Build(Sample{}, sampleOf(t0, a0))
	if f.Instances[0].Rate != -1 || f.Partitions[0].Rate != -1 {
		t.Errorf("with one sample: rates %v, %v; want -1", f.Instances[0].Rate, f.Partitions[0].Rate)
	}
}

// TestSort sorts by each column, descending but for the name, ties by
// name; unknown values last; the keys cycle through the columns.
func TestSort(t *testing.T) {
	f := Frame{
		Instances: []InstanceRow{{Instance: "b", Rate: 5, Judged: 1}, {Instance: "a", Rate: 5, Judged: 9}, {Instance: "c", Rate: -1, Judged: 5}},
		Partitions: []PartitionRow{{Partition: 2, Rate: 1, Judged: 10, Repeats: 5}, {Partition: 0, Rate: 7, Judged: 10, Repeats: 1},
			{Partition: 1, Rate: -1}},
	}
	names := func() string {
		var s []string
		for _, r := range f.Instances {
			s = append(s, r.Instance)
		}
		return strings.Join(s, "")
	}
	parts := func() string {
		var s []string
		for _, r := range f.Partitions {
			s = append(s, string(rune('0'+r.Partition)))
		}
		return strings.Join(s, "")
	}
	for _, c := range []struct {
		s            Sort
		inst, partns string
	}{
		{Sort{}, "abc", "012"},
		{Sort{By: ByRate, Desc: true}, "abc", "021"},
		{Sort{By: ByRate}, "cab", "120"},
		{Sort{By: ByJudged, Desc: true}, "acb", "021"},
		{Sort{By: ByRepeatShare, Desc: true}, "abc", "201"},
		{Sort{By: ByP99, Desc: true}, "abc", "012"}, // no P99 anywhere, and none for partitions: by name
	} {
		c.s.Apply(&f)
		if names() != c.inst || parts() != c.partns {
			t.Errorf("sorted by %v desc %v: instances %s, partitions %s; want %s, %s", c.s.By, c.s.Desc, names(), parts(), c.inst, c.partns)
		}
	}
	s := Sort{}
	for i := range int(columns) {
		s = s.Next(1)
		if want := Column((i + 1) % int(columns)); s.By != want || s.Desc != (want != ByName) {
			t.Errorf("Next %d times = %+v, want %v", i+1, s, want)
		}
	}
	if s.Next(-1).By != ByBacklog {
		t.Errorf("Next(-1) from name = %v, want backlog", s.Next(-1).By)
	}
	for _, n := range ColumnNames() {
		if c, ok := ParseColumn(n); !ok || c.String() != n {
			t.Errorf("ParseColumn(%q) = %v, %v", n, c, ok)
		}
	}
	if _, ok := ParseColumn("bogus"); ok {
		t.Error("ParseColumn(bogus) ok")
	}
}

var escape = regexp.MustCompile("\x1b")

// frame is a frame with something in every column: a p99 near W, dead
// letters, a restore, an instance without an answer.
func frame() Frame {
	p99 := 50 * time.Minute
	n := 12
	return Frame{At: t0, Window: time.Hour,
		Instances: []InstanceRow{
			{Instance: "a", Answered: true, Ready: true, Owned: []int{0, 1}, NATS: &admin.NATSState{Connected: true}, Rate: 12.5,
				Judged: 100, Repeats: 25, P99: &p99, Window: time.Hour, DeadLetters: map[string]uint64{"no_key": 2, "bad_payload": 3},
				DeadTotal: 5, Backlog: &admin.Backlog{Pending: 7, AckPending: 1}},
			{Instance: "b", Answered: true, Ready: true, Owned: []int{2}, Restoring: map[int]int{2: n}, Rate: -1},
			{Instance: "c", Rate: -1},
		},
		Partitions: []PartitionRow{
			{Partition: 0, Owners: []string{"a"}, Rate: 10, Judged: 80, New: 60, Repeats: 20},
			{Partition: 1, Owners: []string{"a"}, Rate: 2.5, Judged: 20, New: 15, Repeats: 5, DeadLetters: 2, Backlog: &admin.Backlog{Pending: 3}},
			{Partition: 2, Owners: []string{"b"}, Rate: -1, Restoring: &n},
			{Partition: 3, Rate: -1},
		},
	}
}

// TestRenderPlain renders a frame without colour, as NO_COLOR asks: no
// escape sequence; every instance and partition on a line of its own with
// its values; the columns aligned (every value of a column ends, or
// starts, at the same place); the sort column marked.
func TestRenderPlain(t *testing.T) {
	out := Render(frame(), Header{Subject: "dedupe.admin.g", Interval: time.Second}, Sort{By: ByRate, Desc: true}, NewStyles(io.Discard, false), true)
	t.Logf("\n%s", out)
	if escape.MatchString(out) {
		t.Fatalf("plain output has escape sequences:\n%q", out)
	}
	for _, want := range []string{
		"dedupe.admin.g  2 instance(s), 4 partition(s)  W 1h0m0s  every 1s  sorted by rate ↓",
		"RATE/S↓",
		"bad_payload 3, no_key 2",
		"50m0s / 1h0m0s (83%)",
		"no answer",
		"restoring",
		"p2 12 records",
		"12 records",
		"q quit",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	lines := strings.Split(out, "\n")
	row := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line starts with %q:\n%s", prefix, out)
		return ""
	}
	if !regexp.MustCompile(`^a +ready +up +0,1 +12\.5 +100 +25\.0% +50m0s / 1h0m0s \(83%\) +bad_payload 3, no_key 2 +7 +1 *$`).MatchString(row("a ")) {
		t.Errorf("instance a's line: %q", row("a "))
	}
	if !regexp.MustCompile(`^ +1 +a +2\.5 +20 +15 +5 +25\.0% +0 +2 +3 +0 *$`).MatchString(row("        1")) {
		t.Errorf("partition 1's line: %q", row("        1"))
	}
	if !regexp.MustCompile(`^ +3 +none +- +0 +0 +0 +- +0 +0 +- +- *$`).MatchString(row("        3")) {
		t.Errorf("partition 3's line: %q", row("        3"))
	}
	// Right-aligned columns end together: JUDGED in the partitions' table.
	head := []rune(row("PARTITION"))
	end := strings.Index(string(head), "JUDGED")
	end = len([]rune(string(head)[:end])) + len("JUDGED")
	for _, p := range []string{"        0", "        1"} {
		l := []rune(row(p))
		if l[end-1] == ' ' || l[end] != ' ' {
			t.Errorf("partition line %q: JUDGED does not end at column %d", string(l), end)
		}
	}
}

// TestRenderColour colours the same frame: escape sequences, and the same
// text once they are taken out.
func TestRenderColour(t *testing.T) {
	h, s := Header{Subject: "x", Interval: time.Second}, Sort{}
	coloured := Render(frame(), h, s, NewStyles(io.Discard, true), true)
	plain := Render(frame(), h, s, NewStyles(io.Discard, false), true)
	if !escape.MatchString(coloured) {
		t.Fatal("coloured output has no escape sequence")
	}
	if stripped := regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(coloured, ""); stripped != plain {
		t.Errorf("coloured output without its escapes differs from the plain one:\n%s\n---\n%s", stripped, plain)
	}
}

// TestColour: colours on a terminal only, and never with NO_COLOR set.
func TestColour(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	if !Colour(env(""), true) || Colour(env("1"), true) || Colour(env(""), false) {
		t.Error("Colour: want true on a terminal without NO_COLOR only")
	}
}

// TestModelKeys drives the model as bubbletea would: a sample makes a
// frame and asks for the next tick; the keys change the sort and quit.
func TestModelKeys(t *testing.T) {
	fetch := func() Fetch { return nil }()
	m := NewModel(fetch, Header{Subject: "x", Interval: time.Second}, Sort{}, NewStyles(io.Discard, false))
	if v := m.View(); !strings.Contains(v, "asking the instances") {
		t.Errorf("view before a sample: %q", v)
	}
	next, cmd := m.Update(sampleMsg(sampleOf(time.Now(), reply("a", t0, []int{0, 1, 2, 3}, [4]uint64{1, 2, 3, 4}, [4]uint64{}))))
	if cmd == nil {
		t.Error("a sample does not schedule the next")
	}
	if v := next.View(); !strings.Contains(v, "1 instance(s), 4 partition(s)") {
		t.Errorf("view after a sample:\n%s", v)
	}
	for _, c := range []struct {
		key  string
		want Sort
	}{
		{"s", Sort{By: ByRate, Desc: true}},
		{"r", Sort{By: ByRate}},
		{"right", Sort{By: ByJudged, Desc: true}},
		{"S", Sort{By: ByRate, Desc: true}},
		{"7", Sort{By: ByBacklog, Desc: true}},
		{"1", Sort{}},
		{"9", Sort{}},
	} {
		next, _ = next.Update(keyMsg(c.key))
		if got := next.(Model).SortBy(); got != c.want {
			t.Errorf("after key %q: sort %+v, want %+v", c.key, got, c.want)
		}
	}
	if _, cmd := next.Update(keyMsg("q")); cmd == nil {
		t.Error("q does not quit")
	} else if _, ok := cmd().(tea.QuitMsg); !ok {
		t.Error("q's command is not tea.Quit")
	}
}

// keyMsg is the key message bubbletea sends for k.
func keyMsg(k string) tea.KeyMsg {
	switch k {
	case "right":
		return tea.KeyMsg{Type: tea.KeyRight}
	}
	return tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
}
