package stage

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/dedupe-stage/dedupe-stage/config"
)

// StartEmbedded starts an in-process nats-server with JetStream for the
// embedded default: listening on cfg.Host:cfg.Port, storing under
// cfg.StoreDir (or dataDir/nats), syncing every write before acknowledging it
// when cfg.SyncAlways is set. The server does not install signal handlers, so
// the process keeps its own. The caller shuts it down.
func StartEmbedded(cfg config.Embedded, dataDir string, log *slog.Logger) (*server.Server, error) {
	storeDir := cfg.StoreDirIn(dataDir)
	opts := &server.Options{
		ServerName: "dedupe-stage-embedded",
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   storeDir,
		NoSigs:     true,
		SyncAlways: cfg.SyncAlways,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	s.SetLoggerV2(serverLogger{log.With("component", "nats-server")}, false, false, false)
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats-server on %s:%d did not become ready in 30s (is the port in use?)", cfg.Host, cfg.Port)
	}
	log.Info("embedded nats-server started", "url", s.ClientURL(), "store_dir", storeDir, "sync_always", cfg.SyncAlways)
	return s, nil
}

// serverLogger routes nats-server's logs to slog. Its notices (the start-up
// banner among them) become debug: the stage logs what an operator needs.
type serverLogger struct{ log *slog.Logger }

func (l serverLogger) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLogger) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l serverLogger) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLogger) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLogger) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLogger) Tracef(format string, v ...any)  {}
