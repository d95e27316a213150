package bloom_test

import (
	"bytes"
	"fmt"
	"time"

	"github.com/dedupe-stage/dedupe-stage/bloom"
)

func Example() {
	opts := bloom.DefaultOptions(4 * time.Hour)
	opts.ExpectedKeys = 10_000
	start := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	now := start
	f, err := bloom.New(opts, now)
	if err != nil {
		panic(err)
	}

	f.Advance(now)
	f.Add([]byte("order-1"), now)
	fmt.Println("just added:", f.Test([]byte("order-1")))
	fmt.Println("never added:", f.Test([]byte("order-2")))

	// Still remembered until W has passed ...
	now = start.Add(4*time.Hour - time.Nanosecond)
	f.Advance(now)
	fmt.Println("W-1ns later:", f.Test([]byte("order-1")))

	// ... and forgotten once W plus one generation span has passed.
	now = start.Add(4*time.Hour + f.Span())
	f.Advance(now)
	fmt.Println("W+span later:", f.Test([]byte("order-1")))

	// Save and restore, with an opaque value for the caller.
	var buf bytes.Buffer
	if _, err := f.WriteSnapshot(&buf, 42); err != nil {
		panic(err)
	}
	g, meta, err := bloom.ReadSnapshot(&buf, opts)
	if err != nil {
		panic(err)
	}
	fmt.Println("restored meta:", meta, "keys:", g.Keys())
	// Output:
	// just added: true
	// never added: false
	// W-1ns later: true
	// W+span later: false
	// restored meta: 42 keys: 0
}
