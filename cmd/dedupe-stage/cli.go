package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// Exit codes of every command (README, "Exit codes"). status keeps a
// monitoring check's codes instead: statusOK, statusCritical,
// statusUnknown.
const (
	exitOK       = 0 // done; check-config found nothing that stops run
	exitFindings = 1 // a failure, an invalid configuration, or findings that stop run
	exitUsage    = 2 // an unknown command, flag or argument, or a bad flag value
	exitConnect  = 3 // the server (NATS, or the stage's HTTP port) cannot be reached
)

// exitTable is the exit codes as help and the README give them.
const exitTable = "0 OK, 1 failure or findings, 2 usage, 3 cannot connect"

// exitError is an error with the exit status the command ends with.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitedError ends a command that has printed its own message.
type exitedError struct{ code int }

func (e exitedError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// exited is the error of a command that printed its own message and
// ends with code.
func exited(code int) error { return exitedError{code} }

// Flag groups, in the order help shows them.
const (
	groupOwn      = "own"
	groupConn     = "conn"
	groupEmbedded = "embedded"
	groupKey      = "dedupe-stage/group"
)

// groupTitles are the headings of the flag groups in help.
var groupTitles = map[string]string{
	groupOwn:      "Flags",
	groupConn:     "Connection flags (as the nats CLI's; flag > environment > --config file > --context)",
	groupEmbedded: "Embedded server flags (when no server is given)",
}

// connFlags are the configuration flags that say how to connect to NATS.
var connFlags = []string{"server", "s", "nats-url", "context", "user", "password", "token", "creds", "nkey",
	"tlscert", "tlskey", "tlsca", "tlsfirst", "tls-first", "js-domain", "js-api-prefix"}

// flagGroup returns the group of a configuration flag.
func flagGroup(name string) string {
	switch {
	case slices.Contains(connFlags, name):
		return groupConn
	case strings.HasPrefix(name, "embedded-"):
		return groupEmbedded
	}
	return groupOwn
}

// cli is the command line of one run of the binary.
type cli struct {
	stdout, stderr io.Writer
	// raw are the arguments of the command being run, after its name, as
	// given (long flags with two dashes): loadConfig reads the
	// configuration flags from them, in their place in the precedence.
	raw []string
}

// addConfigFlags adds to cmd --config and the flags of
// config.RegisterFlags that the command takes (only; nil: all), writing
// into a configuration of their own: cobra parses and checks them, lists
// them in help and completes them, and loadConfig reads them again from
// the arguments, in their place in the precedence flag > environment >
// file > context. Flags outside show (nil: all) are taken but not shown.
// The defaults shown are the configuration's from $DEDUPE_CONFIG and the
// environment, never a credential.
func addConfigFlags(cmd *cobra.Command, only, show flagSet) {
	scratch := helpDefaults()
	path := ""
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&path, "config", "", "YAML config file (configs/README.md); default $"+configEnv)
	_ = cmd.MarkFlagFilename("config", "yaml", "yml")
	std := flag.NewFlagSet(cmd.Name(), flag.ContinueOnError)
	scratch.RegisterFlags(std)
	taken := func(name string) bool { return only == nil || slices.Contains(only, name) }
	for _, f := range inHelpOrder(std) {
		if !taken(f.Name) || f.Name == "s" {
			continue
		}
		short := ""
		if f.Name == "server" && taken("s") {
			short = "s"
		}
		pf := fs.VarPF(pflagValue{f.Value}, f.Name, short, f.Usage)
		pf.DefValue = f.DefValue
		if isBoolFlag(f.Value) {
			pf.NoOptDefVal = "true"
		}
		pf.Annotations = map[string][]string{groupKey: {flagGroup(f.Name)}}
		pf.Hidden = show != nil && !slices.Contains(show, f.Name)
	}
	_ = cmd.RegisterFlagCompletionFunc("log-level", fixedCompletion("debug", "info", "warn", "error"))
	_ = cmd.RegisterFlagCompletionFunc("log-format", fixedCompletion("text", "json"))
}

// helpOrder is the order of the configuration flags in help: by group,
// the most used first. A flag not listed comes after them.
var helpOrder = []string{
	"key-header", "data-dir", "partitions", "http-addr", "input-stream", "output-stream", "create-streams",
	"sync-writes", "scale-out", "scale-out-group", "instance", "log-level", "log-format",
	"server", "nats-url", "context", "creds", "nkey", "user", "password", "token", "tlscert", "tlskey", "tlsca",
	"tlsfirst", "tls-first", "js-domain", "js-api-prefix",
	"embedded-host", "embedded-port", "embedded-monitor-port", "embedded-user", "embedded-password",
	"embedded-token", "embedded-system-account", "embedded-system-password",
}

// inHelpOrder returns the flags of fs in helpOrder.
func inHelpOrder(fs *flag.FlagSet) []*flag.Flag {
	var out []*flag.Flag
	for _, name := range helpOrder {
		if f := fs.Lookup(name); f != nil {
			out = append(out, f)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(helpOrder, f.Name) {
			out = append(out, f)
		}
	})
	return out
}

// helpDefaults is the configuration whose values help shows as the
// flags' defaults: the file $DEDUPE_CONFIG names and the environment over
// the defaults, as far as they load.
func helpDefaults() *config.Config {
	cfg := config.Default()
	if path := os.Getenv(configEnv); path != "" {
		if c, err := config.Load(path); err == nil {
			cfg = c
		}
	}
	_ = cfg.ApplyEnv(os.Getenv)
	return &cfg
}

// isBoolFlag reports whether a flag.Value takes no argument.
func isBoolFlag(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// pflagValue is a flag.Value as a pflag.Value.
type pflagValue struct{ flag.Value }

// Type is the value's name in help: the go flag package's name for it,
// "string" for a value of its own type.
func (v pflagValue) Type() string {
	name, _ := flag.UnquoteUsage(&flag.Flag{Value: v.Value})
	switch name {
	case "":
		return "bool"
	case "value":
		return "string"
	}
	return name
}

// fixedCompletion completes a flag's value from a list.
func fixedCompletion(values ...string) cobra.CompletionFunc {
	return func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}

// ownGroup marks every flag of fs so far as the command's own.
func ownGroup(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Annotations == nil {
			f.Annotations = map[string][]string{groupKey: {groupOwn}}
		}
	})
}

// usageTemplate is cobra's usage text with the flags in groups and the
// command's exit codes.
const usageTemplate = `Usage:{{if .Runnable}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} <command> [flags]{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}

Commands:{{range .Commands}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{flagGroups .}}{{with exitCodes .}}

Exit codes: {{.}}{{end}}{{if .HasAvailableSubCommands}}

Run '{{.CommandPath}} <command> --help' for a command's flags and examples.{{end}}
`

// flagGroups renders cmd's shown flags by group: its own, then the
// connection's, then the embedded server's.
func flagGroups(cmd *cobra.Command) string {
	var b strings.Builder
	for _, g := range []string{groupOwn, groupConn, groupEmbedded} {
		set := pflag.NewFlagSet(g, pflag.ContinueOnError)
		set.SortFlags = false
		cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
			in := groupOwn
			if a := f.Annotations[groupKey]; len(a) > 0 {
				in = a[0]
			}
			if in == g && !f.Hidden {
				set.AddFlag(f)
			}
		})
		if !set.HasAvailableFlags() {
			continue
		}
		fmt.Fprintf(&b, "\n\n%s:\n%s", groupTitles[g], strings.TrimRight(set.FlagUsagesWrapped(110), " \n"))
	}
	return b.String()
}

// exitCodesKey annotates a command whose exit codes are not exitTable.
const exitCodesKey = "dedupe-stage/exit-codes"

// exitCodes returns the exit codes help shows for cmd.
func exitCodes(cmd *cobra.Command) string {
	if cmd.HasAvailableSubCommands() {
		return ""
	}
	if s, ok := cmd.Annotations[exitCodesKey]; ok {
		return s
	}
	return exitTable
}

func init() {
	cobra.AddTemplateFunc("flagGroups", flagGroups)
	cobra.AddTemplateFunc("exitCodes", exitCodes)
	cobra.EnableCommandSorting = false // the order newRootCmd adds them: run first
}

// newRootCmd returns the dedupe-stage command with every command under
// it, writing to stdout and stderr.
func (c *cli) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "dedupe-stage",
		Short: "Forward each intent once from an input JetStream stream to an output stream",
		Long: `dedupe-stage forwards each intent once from an input JetStream stream to an output stream.
It recognises repeats by a key (a header, a JSON field or a subject token) and dead-letters
what it cannot judge. Configuration: a YAML file (--config or $DEDUPE_CONFIG), DEDUPE_*
variables over it, flags over both (configs/README.md).`,
		Example: `  dedupe-stage run --key-header Order-Id        # embedded nats-server on 127.0.0.1:4222, state in ./data
  dedupe-stage run --context prod --config stage.yaml
  dedupe-stage check-config --connect --context prod --config stage.yaml
  dedupe-stage completion bash > /etc/bash_completion.d/dedupe-stage`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetUsageTemplate(usageTemplate)
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(c.newRunCmd(), c.newCheckConfigCmd(), c.newStatusCmd(), c.newInspectCmd(), c.newForgetCmd(),
		c.newRedriveCmd(), c.newHealthcheckCmd(), c.newVersionCmd(), c.newCompletionCmd())
	root.AddCommand(c.newTestCmd())
	root.AddCommand(c.newTopCmd())
	root.AddCommand(c.newAnalyzeCmd())
	return root
}

// noPositional is the Args of a command that takes flags only.
func noPositional(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return &exitError{code: exitUsage, err: fmt.Errorf("%s takes no arguments besides flags, got %q", cmd.Name(), args)}
}

// flagError makes a flag parse error a usage error that names the
// closest flag the command has.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		msg = "unknown flag --" + name
		if s := suggestFlag(cmd, name); s != "" {
			msg += "; did you mean --" + s + "?"
		}
	}
	return &exitError{code: exitUsage, err: errors.New(msg)}
}

// suggestFlag returns the shown flag of cmd closest to name, or "".
func suggestFlag(cmd *cobra.Command, name string) string {
	best, bestD := "", 3
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := levenshtein(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// levenshtein is the edit distance between a and b.
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// singleDashLong matches a long flag written with one dash, as the Go flag
// package and the releases before this command line took them: -config,
// -json=true.
var singleDashLong = regexp.MustCompile(`^-([A-Za-z][A-Za-z0-9-]+)(=.*)?$`)

// normalizeArgs rewrites the long flags written with one dash in a
// command's arguments to two (-config FILE to --config FILE), leaving
// alone the values of flags that take one and everything after "--".
func normalizeArgs(cmd *cobra.Command, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if singleDashLong.MatchString(a) {
			a = "-" + a
		}
		out = append(out, a)
		var f *pflag.Flag
		switch {
		case strings.HasPrefix(a, "--") && !strings.Contains(a, "="):
			f = cmd.Flags().Lookup(a[2:])
		case len(a) == 2 && a[0] == '-':
			f = cmd.Flags().ShorthandLookup(a[1:])
		}
		if f != nil && f.NoOptDefVal == "" && i+1 < len(args) {
			out = append(out, args[i+1])
			i++
		}
	}
	return out
}

// realMain runs the command line args and returns the exit status.
func realMain(args []string, stdout, stderr io.Writer) int {
	c := &cli{stdout: stdout, stderr: stderr}
	root := c.newRootCmd()
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s\n\n%s", root.Long, root.UsageString())
		return exitUsage
	}
	switch args[0] {
	case "--version", "-version":
		args = append([]string{"version"}, args[1:]...)
	case "-help":
		args = []string{"--help"}
	}
	sub, _, err := root.Find(args[:1])
	if err == nil && sub != root {
		args = append(args[:1:1], normalizeArgs(sub, args[1:])...)
		c.raw = args[1:]
	} else if !strings.HasPrefix(args[0], "-") && args[0] != "help" && !strings.HasPrefix(args[0], "__complete") {
		msg := fmt.Sprintf("unknown command %q", args[0])
		if s := root.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf("; did you mean %q?", s[0])
		}
		fmt.Fprintf(stderr, "dedupe-stage: %s\nRun 'dedupe-stage --help' for the commands.\n", msg)
		return exitUsage
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	return exitStatus(cmd, err, stderr)
}

// exitStatus prints err, unless its command did, and returns the exit
// status of cmd ending with err.
func exitStatus(cmd *cobra.Command, err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	var done exitedError
	if errors.As(err, &done) {
		return done.code
	}
	code := exitFindings
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	if cmd != nil && cmd.Name() == "status" {
		// A monitoring check: what it cannot tell is UNKNOWN.
		fmt.Fprintln(stderr, "dedupe-stage: UNKNOWN:", err)
		return statusUnknown
	}
	prefix := "dedupe-stage"
	if cmd != nil && cmd.HasParent() {
		prefix = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "%s: %v\n", prefix, err)
	if code == exitUsage && cmd != nil {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}
