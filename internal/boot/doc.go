// Package boot starts what a dedupe-stage process needs before its
// pipeline runs: the hold on the data directory (LockDataDir), the
// embedded nats-server of the single-instance default (StartEmbedded) and
// the NATS connection (Connect). None of it judges a message; the pipeline
// in package stage takes the connection as a value. It takes plain values
// (Embedded, Dial), which the configuration builds, and imports nothing
// of the configuration.
//
// The order main follows:
//
//	lock, err := boot.LockDataDir(cfg.State.DataDir, cfg.EmbeddedStoreDir())
//	defer lock.Release()
//	srv, err := boot.StartEmbedded(cfg.EmbeddedServer(), log) // only when cfg.NATS.IsEmbedded()
//	nc, err := boot.Connect(cfg.NATS.Dial(), srv, log)
//	st, err := stage.New(ctx, stage.Options{Config: cfg, Conn: nc, ...})
package boot
