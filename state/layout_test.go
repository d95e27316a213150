package state

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLayoutRecordsPartitioning: a scale-out data dir records the server's
// hash and the group in LAYOUT, and a data dir is refused by a
// configuration that places keys another way, by another group, or in
// another count of partitions.
func TestLayoutRecordsPartitioning(t *testing.T) {
	server := func(group string) Partitioning { return Partitioning{Hash: HashServerFNV1a32, Group: group} }
	open := func(dir string, n int, how Partitioning) error {
		t.Helper()
		o := testOptions(t, dir, n)
		o.Partitioning = how
		s, err := Open(context.Background(), o)
		if err == nil {
			err = s.Close()
		}
		return err
	}

	scaled := t.TempDir()
	if err := open(scaled, 4, server("dedupe")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(scaled, LayoutFile)); string(b) != "partitions 4\nhash server-fnv1a32\ngroup dedupe\nstore one-badger\n" {
		t.Fatalf("LAYOUT = %q, want the count, the server's hash and the group", b)
	}
	if err := open(scaled, 4, server("dedupe")); err != nil {
		t.Errorf("reopen with the same layout: %v", err)
	}
	single := t.TempDir()
	if err := open(single, 4, Partitioning{}); err != nil {
		t.Fatal(err)
	}
	// The store line makes versions that kept a Badger instance per
	// partition refuse the dir instead of opening empty partitions in it.
	if b, _ := os.ReadFile(filepath.Join(single, LayoutFile)); string(b) != "partitions 4\nstore one-badger\n" {
		t.Fatalf("single-instance LAYOUT = %q, want \"partitions 4\\nstore one-badger\\n\"", b)
	}

	for _, tt := range []struct {
		name string
		dir  string
		n    int
		how  Partitioning
		want string
	}{
		{"scale-out dir, single instance", scaled, 4, Partitioning{}, "placed in partitions by hash server-fnv1a32, group dedupe"},
		{"scale-out dir, another group", scaled, 4, server("other"), "and hash server-fnv1a32, group other was asked for"},
		{"scale-out dir, another count", scaled, 8, server("dedupe"), "made with 4 partitions"},
		{"single-instance dir, scale-out", single, 4, server("dedupe"), "placed in partitions by hash xxhash64"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := open(tt.dir, tt.n, tt.how)
			if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open: %v, want ErrLayout saying %q", err, tt.want)
			}
		})
	}

	// Partition dirs without a LAYOUT have no record of how keys were
	// placed: scale-out refuses them.
	if err := os.Remove(filepath.Join(single, LayoutFile)); err != nil {
		t.Fatal(err)
	}
	if err := open(single, 4, server("dedupe")); !errors.Is(err, ErrLayout) {
		t.Errorf("scale-out over partition dirs without LAYOUT: %v, want ErrLayout", err)
	}

	o := testOptions(t, t.TempDir(), 2)
	o.Partitioning = Partitioning{Hash: HashServerFNV1a32}
	if _, err := Open(context.Background(), o); !errors.Is(err, ErrBadOptions) {
		t.Errorf("server hash without a group: %v, want ErrBadOptions", err)
	}
}
