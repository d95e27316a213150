// Package faults holds black-box fault tests of dedupe-stage: each test runs
// the real binary (cmd/dedupe-stage, built by TestMain) as a subprocess with
// a YAML configuration, against a real nats-server process (built from the
// nats-server module, JetStream with sync_interval: always where a test
// kills the server, restartable on the same port and store), breaks
// something underneath it, and checks the two promises at the end: every
// key is in the output stream exactly once, and the dead letters are
// exactly the bad inputs.
//
// The faults:
//
//   - TestKill9AtRandomMoments: SIGKILL at seeded random moments, during
//     the filter rebuild at start and while forwarding (DEDUPE_FAULTS_SEED
//     picks another seed);
//   - TestKillBetweenAtomicPublishAndCommit: SIGKILL while the stage
//     publishes its output as atomic batches (output.publish: atomic), until
//     a kill lands between a batch's commit ack and the commit of its
//     claims and the next run's batch is refused for an id the output
//     holds (10201) and published one message at a time;
//   - TestNATSServerRestart: the nats-server stopped (SIGTERM, then SIGKILL)
//     and restarted under the running stage;
//   - TestOutputRefusesPublishes: the output stream at its message limit
//     with discard-new, then deleted, then back;
//   - TestDataDirFull: the data directory's file system (a small tmpfs,
//     root only) full while running and at start;
//   - TestFilterSnapshotCorruptOrMissing: filter snapshots removed,
//     corrupted, truncated, emptied, replaced by garbage or by stale ones.
//   - TestScaleOutKillAddStop, TestScaleOutZombieFenced,
//     TestScaleOutNodeRestart, TestScaleOutLeaderKills: a scale-out group
//     on a 3-node cluster with instances killed, paused or stopped and
//     cluster nodes killed (docs/scale-out.md §9);
//   - TestScaleOutGroupStart: three instances started at the same moment
//     on fresh clusters, ten rounds; every partition taken within 2 s;
//   - TestPolicyGroupOwnerKilled: version-wins, the sliding window and
//     dedupe-stage forget in a group, the keys' owner SIGKILLed between
//     the forget and the keys' next copies;
//   - TestDowntimeDoesNotAgeACopy, TestBacklogJudgedByInputTime: copies
//     published while the stage is stopped are judged by the times the
//     input stored them (docs/state.md, "The input's clock");
//   - TestWipedDataDirOneInstance, TestWipedDataDirGroupMember: a data dir
//     removed between two runs is restored from the output, versions,
//     moved window ends and forgets included;
//   - TestSameInputSameForwards: one seeded input through one instance, a
//     group, and a group with kills forwards the same keys as often;
//   - TestStatusAsACheck: dedupe-stage status on an idle, a drained and a
//     stalled group, and its exit codes;
//   - TestTotalsSurviveANodeKill: the node leading the totals bucket
//     SIGKILLed mid-run on a 3-node cluster.
//
// The network faults put a TCP proxy (internal/testkit/netfault) between
// the stage and its servers, or on the routes between the servers, and
// break the link while both ends run on:
//
//   - TestLinkCutOneInstance: one instance's link held (nothing reset,
//     nothing delivered) for 2 x input.ack_wait, three times, with a
//     SIGTERM during a cut and a second after one; each stop in a bound;
//   - TestGroupOwnerCutOff: a group instance cut off the cluster until
//     its partitions have moved; its writes after are fenced off;
//   - TestSlowNetwork: 200 ms +- 100 ms and 256 KiB/s each way for a
//     whole run with two SIGKILLs (DEDUPE_FAULTS_NET_CLEAN=1: the same
//     without them, for the throughput comparison);
//   - TestConnectionsDieMidWrite: a connection reset or closed in the
//     middle of atomic batches and of a partition's restore;
//   - TestNodeCutFromPeers: a node's routes held for 20 s while instances
//     run, one connected to that node alone.
//
// Every test but TestScaleOutGroupStart, TestPolicyGroupOwnerKilled and
// TestWipedDataDirGroupMember runs in parallel with the others (each has
// its own servers, ports and directories, and waits on its own processes;
// what they assert are counts, not times). Those three bound times (a
// group's start; a takeover, or a wiped member's return, and the copies
// around it, within the window), so they run alone: go test runs them
// before the parallel ones, and .ci/test runs them on their own once every
// other test has finished.
//
// docs/faults.md tabulates what the stage did and how to reproduce each.
// The package has no code outside its tests.
package faults
