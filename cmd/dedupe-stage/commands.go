package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
)

// The commands: each has a one-line summary, a description and examples.
// Their work is done by the functions they call (runCmd, checkConfigCmd,
// ...), which read the configuration from c.raw with loadConfig.

func (c *cli) newRunCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "Run the stage",
		Long: `Run the stage: read the input stream, forward each key's first copy to the output stream,
acknowledge repeats and dead-letter what cannot be judged.

With no server given (--server, $NATS_URL, --context), it runs an embedded nats-server with
JetStream on 127.0.0.1:4222 and keeps its state in ./data. SIGINT or SIGTERM stops it cleanly;
a second one exits at once. SIGHUP reloads the configuration (log.level applies at once).`,
		Example: `  dedupe-stage run --key-header Order-Id                   # embedded server, state in ./data
  dedupe-stage run --context prod --config stage.yaml --create-streams
  NATS_URL=nats://n1:4222 NATS_CREDS=./stage.creds dedupe-stage run --key-header Order-Id`,
		Args: noPositional,
		RunE: func(*cobra.Command, []string) error { return runCmd(c.raw, c.stderr) },
	}
	addConfigFlags(cmd, nil, nil)
	return cmd
}

func (c *cli) newCheckConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check-config [FILE] [flags]",
		Short: "Validate the configuration run would use, and check it against the server",
		Long: `Validate the configuration run would use with the same file, environment and flags.
Print it with where each value came from, the derived window, the sizing and the streams.

With --connect, also run every start-up check of run against the server, read only. Each
finding comes with the nats command that fixes it.`,
		Example: `  dedupe-stage check-config configs/webhooks.yaml
  dedupe-stage check-config --connect --context prod --config stage.yaml
  dedupe-stage check-config --connect --json -s nats://127.0.0.1:4222`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return &exitError{code: exitUsage, err: fmt.Errorf("check-config takes at most one FILE, got %q", args)}
			}
			return nil
		},
		RunE: func(*cobra.Command, []string) error { return checkConfigCmd(c.raw, c.stdout, c.stderr) },
		Annotations: map[string]string{exitCodesKey: "0 valid (with --connect: nothing stops run), 1 invalid or findings that stop run, " +
			"2 usage, 3 cannot connect"},
	}
	var f checkConfigFlags
	addCheckFlags(cmd, &f)
	addConfigFlags(cmd, nil, nil)
	return cmd
}

// statusShows are the configuration flags status's help lists: those
// that say which group or consumer to read.
var statusShows = append(flagSet{"key-header", "partitions", "input-stream", "output-stream", "scale-out",
	"scale-out-group", "log-level"}, connFlags...)

func (c *cli) newStatusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [flags]",
		Short: "Show who owns each partition and how far behind it is, read from the cluster",
		Long: `Show how the stage or its group stands, read from the cluster: no instance needs to run.
For a group: each partition's state, owner, backlog, snapshot and last hand-over.
It is a monitoring check, with the exit codes of "nats server check".`,
		Example: `  dedupe-stage status --context prod --config group.yaml
  dedupe-stage status -s nats://127.0.0.1:4222 --json`,
		Args: noPositional,
		RunE: func(*cobra.Command, []string) error {
			if code := statusMain(c.raw, c.stdout, c.stderr); code != statusOK {
				return exited(code)
			}
			return nil
		},
		Annotations: map[string]string{exitCodesKey: "0 OK (every partition owned, idle, or waiting within the hand-over time), " +
			"2 CRITICAL (input waited without an owner for longer), 3 UNKNOWN (cannot connect, cluster unreadable, bad usage or configuration)"},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON for scripts instead of the table")
	ownGroup(cmd.Flags())
	addConfigFlags(cmd, nil, statusShows)
	return cmd
}

func (c *cli) newInspectCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect KEY [flags]",
		Short: "Tell whether a key is inside the window, and when it was first seen",
		Long: `Tell whether KEY is inside the window: when it was first seen, when it leaves the window,
the output sequence of its forward, and which instance owns it. It asks the stage's admin
service over NATS (the owner of the key's partition answers), or /inspect over HTTP with
--http-addr.`,
		Example: `  dedupe-stage inspect order-1                              # the embedded server of a running stage
  dedupe-stage inspect -s nats://127.0.0.1:4222 order-1
  dedupe-stage inspect --http-addr 127.0.0.1:9464 order-1`,
		Args: exactlyOneKey,
		RunE: func(*cobra.Command, []string) error { return inspectCmd(c.raw, c.stdout, c.stderr) },
	}
	addAdminFlags(cmd)
	return cmd
}

func (c *cli) newForgetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "forget KEY [flags]",
		Short: "Make a key's next copy be forwarded again",
		Long: `Make KEY's next copy be forwarded again: the owner of the key's partition forgets it,
between two of its batches, and says when. The forget holds after a restart.`,
		Example: `  dedupe-stage forget -s nats://127.0.0.1:4222 order-1
  dedupe-stage forget --context prod --config stage.yaml order-1`,
		Args: exactlyOneKey,
		RunE: func(*cobra.Command, []string) error { return forgetCmd(c.raw, c.stdout, c.stderr) },
	}
	addAdminFlags(cmd)
	return cmd
}

// exactlyOneKey is the Args of inspect and forget.
func exactlyOneKey(cmd *cobra.Command, args []string) error {
	if len(args) == 1 {
		return nil
	}
	if len(args) == 0 {
		return &exitError{code: exitUsage, err: fmt.Errorf("%s takes the KEY to %s", cmd.Name(), cmd.Name())}
	}
	return &exitError{code: exitUsage, err: fmt.Errorf("%s takes one KEY, got %d: %q", cmd.Name(), len(args), args)}
}

// addAdminFlags adds inspect's and forget's flags: their own, then the
// configuration's they take.
func addAdminFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.String("admin-subject", "", "the admin service's subject prefix (admin.subject; default dedupe.admin.<consumer or group>)")
	fs.Duration("timeout", admin.DefaultTimeout, "how long to wait for the instances' answers")
	ownGroup(fs)
	addConfigFlags(cmd, adminFlags, nil)
}

// redriveShows are the configuration flags redrive's help lists.
var redriveShows = append(flagSet{"key-header", "log-level"}, connFlags...)

func (c *cli) newRedriveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "redrive [flags]",
		Short: "Publish dead letters again to the input subjects they came from",
		Long: `Publish the selected dead letters again to the input subjects they came from, with the
input's headers and payload. The stage judges each copy like any other input. Each dead
letter is published once, however often the command runs: an interrupted run is run again.`,
		Example: `  dedupe-stage redrive --context prod --reason output_rejected --since 6h --dry-run
  dedupe-stage redrive --context prod --reason output_rejected --since 6h
  dedupe-stage redrive -s nats://127.0.0.1:4222 --from-seq 100 --to-seq 200 --json`,
		Args: noPositional,
		RunE: func(*cobra.Command, []string) error {
			if code := redriveMain(c.raw, c.stdout, c.stderr); code != exitOK {
				return exited(code)
			}
			return nil
		},
		Annotations: map[string]string{exitCodesKey: "0 every selected dead letter republished (now or by an earlier run), " +
			"1 some refused or the run stopped, 2 usage, 3 cannot connect"},
	}
	var f redriveFlags
	cmd.Flags().AddFlagSet(newRedriveFlagSet(&f, c.stderr))
	ownGroup(cmd.Flags())
	_ = cmd.RegisterFlagCompletionFunc("reason", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		var names []string
		for _, r := range deadletter.Reasons() {
			names = append(names, string(r))
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	})
	addConfigFlags(cmd, nil, redriveShows)
	return cmd
}

func (c *cli) newHealthcheckCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "healthcheck [flags]",
		Short: "Exit 0 when the running stage is healthy (for container health checks)",
		Long: `Ask the running stage's /healthz, on the http.addr that run uses (the same file,
environment and --http-addr), and exit 0 when it answers healthy.`,
		Example: `  dedupe-stage healthcheck
  dedupe-stage healthcheck --http-addr 127.0.0.1:9464`,
		Args: noPositional,
		RunE: func(*cobra.Command, []string) error { return healthcheckCmd(c.raw, c.stdout, c.stderr) },
	}
	addConfigFlags(cmd, flagSet{"http-addr"}, nil)
	return cmd
}

func (c *cli) newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, revision, Go version and embedded nats-server version",
		Long: `Print this binary's version, its VCS revision, the Go version that built it and the version
of the nats-server built in. A build that is not a release says so with -dev.`,
		Example: `  dedupe-stage version`,
		Args:    noPositional,
		RunE: func(*cobra.Command, []string) error {
			printVersion(c.stdout, buildInfo())
			return nil
		},
	}
}

func (c *cli) newCompletionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print the shell completion script for bash, zsh or fish",
		Long: `Print the script that completes dedupe-stage's commands, flags and some flag values
in bash, zsh or fish. Load it in the shell, or save it where the shell looks.`,
		Example: `  source <(dedupe-stage completion bash)
  dedupe-stage completion bash > /etc/bash_completion.d/dedupe-stage
  dedupe-stage completion zsh > "${fpath[1]}/_dedupe-stage"
  dedupe-stage completion fish > ~/.config/fish/completions/dedupe-stage.fish`,
		ValidArgs: []cobra.Completion{"bash", "zsh", "fish"},
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.ExactArgs(1)(cmd, args); err != nil {
				return &exitError{code: exitUsage, err: fmt.Errorf("completion takes one shell: bash, zsh or fish")}
			}
			if err := cobra.OnlyValidArgs(cmd, args); err != nil {
				return &exitError{code: exitUsage, err: fmt.Errorf("completion: unknown shell %q; want bash, zsh or fish", args[0])}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(c.stdout, true)
			case "zsh":
				return root.GenZshCompletion(c.stdout)
			default:
				return root.GenFishCompletion(c.stdout, true)
			}
		},
	}
}

// addCheckFlags adds check-config's own flags to cmd, writing into f.
func addCheckFlags(cmd *cobra.Command, f *checkConfigFlags) {
	fs := cmd.Flags()
	fs.BoolVar(&f.connect, "connect", false, "also run run's start-up checks against the server, read only")
	fs.BoolVar(&f.json, "json", false, "with --connect, print the findings as a JSON list for scripts")
	ownGroup(fs)
}
