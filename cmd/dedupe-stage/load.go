package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// configEnv names the config file when --config is not given, so that a
// container's health check reads the same file as its run command.
const configEnv = "DEDUPE_CONFIG"

// flagSet says which of config.RegisterFlags' flags a command takes: nil
// means all of them.
type flagSet []string

// loaded is a configuration as a command will use it.
type loaded struct {
	cfg  config.Config
	path string   // the config file, "" for none
	env  []string // names of the DEDUPE_* variables that were applied
	set  []string // names of the flags given
	args []string // arguments that are not flags
	ctx  config.ContextUse
}

// loadConfig builds the configuration a command uses, exactly as `run` does:
// the config file (--config FILE, -config FILE, $DEDUPE_CONFIG, or a bare
// FILE where the command takes one), then the environment, then the flags,
// which win; last, the nats CLI context named by any of them fills the
// connection fields none of them set (config.ApplyContext). So the
// precedence is flag > environment > file > context. Flags and other
// arguments may come in any order. only limits the flags the command
// accepts. The result is validated. The command line has checked the
// flags already (cli.go), so a flag error here is a usage error too.
func loadConfig(name string, args []string, only flagSet, bareFile bool, _ io.Writer) (loaded, error) {
	// First pass, on a scratch config: find --config and the bare
	// arguments. Errors are reported by the second pass.
	var l loaded
	scratch := config.Default()
	fs0 := newFlagSet(name, &scratch, &l.path, only, io.Discard)
	bare := false
	if pos, err := parseAll(fs0, args); err == nil && bareFile && len(pos) > 0 {
		if l.path != "" && l.path != pos[0] {
			return l, &exitError{exitUsage, fmt.Errorf("two config files: --config %s and %s", l.path, pos[0])}
		}
		l.path, bare = pos[0], true
	}
	if l.path == "" {
		l.path = os.Getenv(configEnv)
	}

	cfg, err := config.Load(l.path)
	if err != nil {
		return l, err
	}
	if err := cfg.ApplyEnv(os.Getenv); err != nil {
		return l, err
	}
	for name := range config.EnvVars() {
		if os.Getenv(name) != "" {
			l.env = append(l.env, name)
		}
	}
	slices.Sort(l.env)
	path := l.path
	fs := newFlagSet(name, &cfg, &path, only, io.Discard)
	if l.args, err = parseAll(fs, args); err != nil {
		return l, &exitError{exitUsage, err}
	}
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "config": // the file is named on its own
		case len(f.Name) == 1: // -s, as the nats CLI spells it
			l.set = append(l.set, "-"+f.Name)
		default:
			l.set = append(l.set, "--"+f.Name)
		}
	})
	if bare {
		l.args = l.args[1:]
	}
	if l.ctx, err = cfg.ApplyContext(os.Getenv); err != nil {
		return l, err
	}
	if err := cfg.Validate(); err != nil {
		if l.path != "" {
			return l, fmt.Errorf("%s is invalid:\n%w", l.path, err)
		}
		return l, fmt.Errorf("invalid config:\n%w", err)
	}
	l.cfg = cfg
	return l, nil
}

// newFlagSet returns the flag set of a command: --config into path, and the
// configuration's flags (those in only, or all) writing into cfg.
func newFlagSet(name string, cfg *config.Config, path *string, only flagSet, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(path, "config", *path, "YAML config file (see configs/); default $"+configEnv)
	if only == nil {
		cfg.RegisterFlags(fs)
		return fs
	}
	all := flag.NewFlagSet(name, flag.ContinueOnError)
	cfg.RegisterFlags(all)
	for _, n := range only {
		f := all.Lookup(n)
		fs.Var(f.Value, f.Name, f.Usage)
		fs.Lookup(n).DefValue = f.DefValue // never a credential
	}
	return fs
}

// parseAll parses flags placed before, between and after other arguments
// and returns the other arguments in order.
func parseAll(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return rest, nil
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// splitOwnFlags takes the flags fs defines (with their values) out of args
// and returns them and the rest, in order.
func splitOwnFlags(fs *pflag.FlagSet, args []string) (own, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if !strings.HasPrefix(a, "-") || f == nil {
			rest = append(rest, a)
			continue
		}
		own = append(own, a)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); hasValue || (ok && b.IsBoolFlag()) {
			continue
		}
		if i+1 < len(args) {
			own = append(own, args[i+1])
			i++
		}
	}
	return own, rest
}

// loadWithOwnFlags is the opening of a command with flags of its own
// beside the configuration's (redrive, test, top, analyze): it parses
// own's flags out of args, then loads the configuration from the rest
// (loadConfig) and refuses other arguments; a usage error is an exitError
// with exitUsage.
func loadWithOwnFlags(name string, own *pflag.FlagSet, args []string, only flagSet, bareFile bool, stderr io.Writer) (loaded, error) {
	ownArgs, rest := splitOwnFlags(own, args)
	if err := own.Parse(ownArgs); err != nil {
		return loaded{}, &exitError{exitUsage, err}
	}
	l, err := loadConfig(name, rest, only, bareFile, stderr)
	if err != nil {
		return l, err
	}
	if err := noArgs(name, l.args); err != nil {
		return l, &exitError{exitUsage, err}
	}
	return l, nil
}

// noArgs is the error for arguments a command does not take.
func noArgs(cmd string, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return fmt.Errorf("%s takes no arguments besides flags, got %q", cmd, args)
}

// sources says where a configuration came from, naming variables and flags
// but never their values.
func (l loaded) sources() string {
	var parts []string
	if l.path != "" {
		parts = append(parts, "file "+l.path)
	} else {
		parts = append(parts, "no file (defaults)")
	}
	if len(l.env) > 0 {
		parts = append(parts, "environment "+strings.Join(l.env, " "))
	}
	if len(l.set) > 0 {
		parts = append(parts, "flags "+strings.Join(l.set, " "))
	}
	s := strings.Join(parts, ", then ")
	if c := l.ctx; c.Name != "" {
		filled := "nothing left to fill"
		if len(c.Fields) > 0 {
			filled = strings.Join(c.Fields, " ")
		}
		s += "; nats context " + c.Name + " (" + c.Path + ") for " + filled
	}
	return s
}

// dialAddr turns a listen address into one to connect to: an unspecified
// host (":9464", "0.0.0.0:9464", "[::]:9464") becomes the loopback address.
func dialAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("http.addr %q: %w", listen, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}

// errNoHTTP is the error of commands that ask the running stage over HTTP
// when http.addr is empty.
var errNoHTTP = errors.New("http.addr is empty, so the stage serves no HTTP; set http.addr, $DEDUPE_HTTP_ADDR or --http-addr")
