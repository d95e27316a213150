package stage

import (
	"context"

	"github.com/dedupe-stage/dedupe-stage/internal/batcher"
	"github.com/dedupe-stage/dedupe-stage/internal/deadletter"
)

// deadLetterBatch is the most dead letters the worker publishes together.
const deadLetterBatch = 256

// deadLetterWorker publishes the dead letters queued together as one batch
// (deadletter.Publisher), waits for the stream to store each, then acks
// the originals; what it does on each failure (retry, shrink, count as
// unstorable) is in docs/failures.md, "Dead letter".
func (s *Stage) deadLetterWorker(ctx context.Context, in <-chan deadletter.Letter) {
	pub := s.deadLetterPublisher()
	batcher.Run(in, deadLetterBatch, 0, func(batch []deadletter.Letter) { pub.Publish(ctx, batch) })
}

// deadLetterPublisher is the stage's dead-letter publisher: the input of
// a copy its source made is the input the copy stands for (inputOf); a
// letter settled is counted by reason and partition and its input acked;
// a fenced group refused ends the tenure that decided it, as a lost pin
// does (source.deadLetterFenced).
func (s *Stage) deadLetterPublisher() *deadletter.Publisher {
	return &deadletter.Publisher{
		JS: s.js, Conn: s.nc, Component: CompDeadLetter, Reporter: s.reporter(""), Logs: s.logs,
		AckWait: s.ackWait, Atomic: s.atomicDeadLetters,
		Subject: s.cfg.DeadLetter.SubjectFor, Note: deadletter.OmittedTooLarge,
		Input: s.deadLetterInput,
		Done: func(dl deadletter.Letter, unstorable bool) {
			if unstorable {
				s.metrics.DeadLettersUnstorable.WithLabelValues(string(dl.Reason)).Inc()
			}
			s.metrics.DeadLetters.WithLabelValues(string(dl.Reason)).Inc()
			if dl.Partition == "" {
				s.metrics.UnpartitionedDeadLetters.Inc()
			} else {
				s.metrics.Messages.WithLabelValues(dl.Partition, outcomeDeadLetter).Inc()
			}
			_ = dl.Msg.Ack()
		},
		Fenced: func(dl deadletter.Letter, n int, err error) {
			s.src.deadLetterFenced(dl.P, dl.Pin)
			s.logs.Warn("dead_letter_fenced", "scale-out: dead letters refused: another instance took the partition's dead-letter fence; they stay unacked for its owner",
				"partition", dl.Partition, "dead_letters", n, "fence", dl.Fence.Subject, "err", err)
		},
	}
}

// deadLetterInput returns where the input of dead letter dl is when its
// message is a copy its source made (source.inputOf), which outlives the
// copy; not for a message dead-lettered as not routed, nor for one whose
// metadata cannot be read. ok false: the message is its own input.
func (s *Stage) deadLetterInput(dl deadletter.Letter) (subject, stream string, seq uint64, ok bool) {
	if dl.Reason == deadletter.ReasonNotRouted {
		return "", "", 0, false
	}
	md, err := dl.Msg.Metadata()
	if err != nil {
		return "", "", 0, false
	}
	return s.src.inputOf(dl.Msg, md.Stream)
}
