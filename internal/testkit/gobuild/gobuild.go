// Package gobuild builds this module's binaries, and nats-server's, for the
// tests and the bench, the way deploy/build-images.sh builds them for the
// images: static (CGO_ENABLED=0) and with -trimpath. One set of flags means
// one entry per package in the Go build cache, so the images, the
// black-box tests and the bench compile nats-server and the stage once
// between them instead of once per flag set.
package gobuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
)

// Binary builds package pkg (an import path, or a directory such as ".")
// into out, with the flags deploy/build-images.sh uses. The go command's
// output goes to stderr.
func Binary(ctx context.Context, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return nil
}

// TestBinary compiles the tests of the package in dir (without the race
// detector) into out, with the same flags as Binary, so that the packages
// it shares with the binaries come from the same cache entries, and
// without go vet's checks, which the package's own test run makes. The go
// command's output goes to stderr.
func TestBinary(ctx context.Context, out, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-vet=off", "-trimpath", "-o", out, dir)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go test -c %s: %w", dir, err)
	}
	return nil
}
