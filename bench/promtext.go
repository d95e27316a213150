package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// series are the samples of a Prometheus text exposition, keyed by the
// series as printed (name and labels, e.g. `dedupe_batch_messages_bucket{le="8"}`).
type series map[string]float64

// scrape reads http://addr/metrics.
func scrape(ctx context.Context, addr string) (series, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	return parseSeries(io.LimitReader(resp.Body, 16<<20))
}

// parseSeries parses the text exposition format: comments are skipped,
// every other line is `<series> <value>`.
func parseSeries(r io.Reader) (series, error) {
	out := series{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[strings.TrimSpace(line[:sp])] = v
	}
	return out, sc.Err()
}

// minus returns s - before, series by series (a series missing before
// counts from 0).
func (s series) minus(before series) series {
	out := series{}
	for k, v := range s {
		out[k] = v - before[k]
	}
	return out
}

// add adds o into s.
func (s series) add(o series) {
	for k, v := range o {
		s[k] += v
	}
}

// sum returns the sum of every series of metric name whose labels contain
// each of labels (`key="value"`).
func (s series) sum(name string, labels ...string) float64 {
	total := 0.0
	for k, v := range s {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(k, l)
		}
		if ok {
			total += v
		}
	}
	return total
}

// histogram returns the count and sum of histogram name and the upper
// bound of the bucket holding quantile q, over every series of it.
func (s series) histogram(name string, q float64) (count, sum, quantile float64) {
	count, sum = s.sum(name+"_count"), s.sum(name+"_sum")
	buckets := map[float64]float64{}
	prefix := name + "_bucket{"
	for k, v := range s {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		i := strings.Index(k, `le="`)
		if i < 0 {
			continue
		}
		le := k[i+4:]
		le = le[:strings.IndexByte(le, '"')]
		b := math.Inf(1)
		if le != "+Inf" {
			var err error
			if b, err = strconv.ParseFloat(le, 64); err != nil {
				continue
			}
		}
		buckets[b] += v
	}
	bounds := make([]float64, 0, len(buckets))
	for b := range buckets {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	for _, b := range bounds {
		if count > 0 && buckets[b] >= q*count {
			return count, sum, b
		}
	}
	return count, sum, 0
}
