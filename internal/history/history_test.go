package history

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestPercentilesWithinTheStatedError adds ages spread from microseconds
// to weeks and checks every percentile against the exact one, within
// RelativeError (0 below 1 ms), and that the W catching a share catches
// at least that share and no less than the exact quantile.
func TestPercentilesWithinTheStatedError(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h histogram
	var ages []time.Duration
	for range 100_000 {
		age := time.Duration(math.Exp(r.Float64() * math.Log(float64(30*24*time.Hour))))
		ages = append(ages, age)
		h.add(age)
	}
	slices.Sort(ages)
	for _, q := range []float64{0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 1} {
		want := ages[int(math.Ceil(q*float64(len(ages))))-1]
		got := h.quantile(q)
		tol := time.Duration(float64(want) * RelativeError)
		if want < time.Millisecond {
			tol = time.Millisecond
		}
		if d := got - want; d > tol || -d > tol {
			t.Errorf("q %v: %v, want %v within %v", q, got, want, tol)
		}
		w := h.catching(q)
		var caught int
		for _, a := range ages {
			if a < w {
				caught++
			}
		}
		if float64(caught) < q*float64(len(ages)) || w <= want {
			t.Errorf("q %v: W %v catches %d of %d; the quantile is %v", q, w, caught, len(ages), want)
		}
	}
	if h.max != ages[len(ages)-1] || h.min != ages[0] {
		t.Errorf("min %v max %v, want %v %v", h.min, h.max, ages[0], ages[len(ages)-1])
	}
}

// TestBucketsOnTheirBounds checks that an age on a bucket's bound falls in
// the bucket it opens.
func TestBucketsOnTheirBounds(t *testing.T) {
	for i := 1; i < numBuckets; i++ {
		b := bound(i - 1)
		if got := bucketOf(b); got != i {
			t.Fatalf("age %v, the bound of bucket %d, fell in bucket %d", b, i-1, got)
		}
		if got := bucketOf(b - 1); got != i-1 {
			t.Fatalf("age %v, just under the bound of bucket %d, fell in bucket %d", b-1, i-1, got)
		}
	}
}

// judgeHeader reads the key from the Id header and the version from V.
func judgeHeader(_ string, hdr nats.Header, _ []byte) Verdict {
	k := hdr.Get("Id")
	if k == "" {
		return Verdict{Reason: "no_key", Detail: "no Id"}
	}
	v := Verdict{Key: []byte(k)}
	if s := hdr.Get("V"); s != "" {
		v.Versioned = true
		v.Version = uint64(s[0] - '0')
	}
	return v
}

// feed adds copies of keys at the given offsets from t0, in order.
type copyAt struct {
	id, version, data string
	at                time.Duration
}

func analyze(t *testing.T, o Options, copies []copyAt) Report {
	t.Helper()
	o.Judge = judgeHeader
	o.TempDir = t.TempDir()
	a, err := newAnalyzer(o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.close(); err != nil {
			t.Error(err)
		}
	}()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, c := range copies {
		h := nats.Header{}
		if c.id != "" {
			h.Set("Id", c.id)
		}
		if c.version != "" {
			h.Set("V", c.version)
		}
		if err := a.add(uint64(i+1), t0.Add(c.at), "events.x", h, []byte(c.data)); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := a.finish()
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestAgesByTheRulesOfRun checks ages of hours, measured as run measures
// them: from the key's first copy, or its last with refresh_on_repeat; a
// newer version starts again; a changed payload is a fingerprint_mismatch
// dead letter unless it is a repeat by policy.
func TestAgesByTheRulesOfRun(t *testing.T) {
	h := time.Hour
	copies := []copyAt{
		{id: "a", data: "1", at: 0},
		{id: "a", data: "1", at: 2 * h},     // 2h after the first
		{id: "a", data: "1", at: 3 * h},     // 3h after the first, 1h after the last
		{id: "b", version: "1", at: 0},      //
		{id: "b", version: "2", at: 5 * h},  // newer: forwarded, ages from here
		{id: "b", version: "1", at: 6 * h},  // stale: 1h
		{id: "c", data: "x", at: 0},         //
		{id: "c", data: "y", at: 10 * h},    // changed payload
		{id: "", data: "no key", at: 1 * h}, // no_key
	}
	rep := analyze(t, Options{W: 90 * time.Minute}, copies)
	if rep.Messages != 9 || rep.Keys != 3 || rep.NewVersions != 1 || rep.Repeats != 3 {
		t.Errorf("messages %d keys %d new versions %d repeats %d; want 9 3 1 3", rep.Messages, rep.Keys, rep.NewVersions, rep.Repeats)
	}
	if len(rep.DeadLetters) != 2 || rep.DeadLetters[0].Reason != "fingerprint_mismatch" || rep.DeadLetters[1].Reason != "no_key" ||
		rep.DeadLetters[0].Example.Seq != 8 || rep.DeadLetters[1].Example.Seq != 9 {
		t.Errorf("dead letters %+v", rep.DeadLetters)
	}
	if rep.Ages.Max != 3*h || rep.Slowest[0].Key != "a" || rep.Slowest[0].FirstSeq != 1 {
		t.Errorf("max %v, slowest %+v; want 3h, key a first seq 1", rep.Ages.Max, rep.Slowest)
	}
	// Ages 2h, 3h, 1h: W 90m forwards 2 again; the W catching all is 3h10m.
	if w := rep.Windows[0]; w.ForwardedAgain != 2 {
		t.Errorf("configured W forwards %d again, want 2", w.ForwardedAgain)
	}
	if want := "W 3h10m catches every repeat seen; your W 1h30m forwards 2 again (66.7 %)"; rep.Recommendation != want {
		t.Errorf("recommendation %q, want %q", rep.Recommendation, want)
	}

	rep = analyze(t, Options{W: 90 * time.Minute, Refresh: true, MismatchIsRepeat: true}, copies)
	// Ages 2h, 1h (since the last copy), 1h, 10h (a repeat by policy).
	if rep.Repeats != 4 || rep.Ages.Max != 10*h || rep.Windows[0].ForwardedAgain != 2 || len(rep.DeadLetters) != 1 {
		t.Errorf("with refresh and mismatches as repeats: %d repeats, max %v, W forwards %d again, dead letters %+v",
			rep.Repeats, rep.Ages.Max, rep.Windows[0].ForwardedAgain, rep.DeadLetters)
	}
	if !strings.HasPrefix(rep.Recommendation, "W 10h10m catches every repeat seen") {
		t.Errorf("recommendation %q", rep.Recommendation)
	}
}

// TestKeysBeyondMemory adds more keys than are held in memory, so that
// their records go to the store on disk and are read back from there.
func TestKeysBeyondMemory(t *testing.T) {
	defer func(n int) { pendingMax = n }(pendingMax)
	pendingMax = 1000
	n := pendingMax*20 + 7
	copies := make([]copyAt, 0, n+1)
	for i := range n {
		copies = append(copies, copyAt{id: "k" + strconv.Itoa(i), at: time.Duration(i) * time.Millisecond})
	}
	copies = append(copies, copyAt{id: "k0", at: time.Duration(n) * time.Millisecond})
	rep := analyze(t, Options{W: time.Hour}, copies)
	if rep.Keys != uint64(n) || rep.Repeats != 1 || rep.Ages.Max != time.Duration(n)*time.Millisecond {
		t.Errorf("keys %d repeats %d max %v, want %d 1 %v", rep.Keys, rep.Repeats, rep.Ages.Max, n, time.Duration(n)*time.Millisecond)
	}
}

// TestFormats checks the words of the recommendation.
func TestFormats(t *testing.T) {
	for d, want := range map[time.Duration]string{3*time.Hour + 10*time.Minute: "3h10m", 52*time.Minute + 3*time.Second: "52m3s",
		2 * time.Hour: "2h", 40 * time.Millisecond: "40ms", 1500 * time.Millisecond: "1.5s"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %s, want %s", d, got, want)
		}
	}
	if Count(1234567) != "1,234,567" || Count(12) != "12" || Percent(0.0005) != "0.05 %" || Percent(0.123) != "12.3 %" {
		t.Errorf("Count or Percent: %s %s %s %s", Count(1234567), Count(12), Percent(0.0005), Percent(0.123))
	}
	for d, want := range map[time.Duration]time.Duration{709 * time.Millisecond: 710 * time.Millisecond,
		3*time.Hour + 1: 3*time.Hour + 10*time.Minute, 50*time.Hour + 1: 51 * time.Hour, 61 * time.Second: 2 * time.Minute} {
		if got := roundUp(d); got != want {
			t.Errorf("roundUp(%v) = %v, want %v", d, got, want)
		}
	}
}
