package state

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{FirstSeen: time.Unix(0, 0), Fingerprint: 0},
		{FirstSeen: time.Unix(1_700_000_000, 123456789), Fingerprint: 1<<64 - 1},
		{FirstSeen: time.Unix(-5, 7), Fingerprint: 42},
	} {
		got, err := decodeRecord(encodeRecord(r))
		if err != nil || !got.FirstSeen.Equal(r.FirstSeen) || got.Fingerprint != r.Fingerprint {
			t.Errorf("round trip of %+v = %+v, %v", r, got, err)
		}
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	good := encodeRecord(Record{FirstSeen: time.Unix(1, 0), Fingerprint: 1})
	wrongVersion := bytes.Clone(good)
	wrongVersion[0] = 2
	for name, b := range map[string][]byte{
		"empty":         nil,
		"short":         good[:16],
		"long":          append(bytes.Clone(good), 0),
		"wrong version": wrongVersion,
	} {
		if _, err := decodeRecord(b); !errors.Is(err, ErrCorruptRecord) {
			t.Errorf("%s: decodeRecord error = %v, want ErrCorruptRecord", name, err)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(Record{FirstSeen: time.Unix(1_700_000_000, 5), Fingerprint: 9}))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 64 {
			return
		}
		r, err := decodeRecord(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("decodeRecord(%x) error %v does not wrap ErrCorruptRecord", b, err)
			}
			return
		}
		if again := encodeRecord(r); !bytes.Equal(again, b) {
			t.Fatalf("decodeRecord(%x) = %+v re-encodes as %x", b, r, again)
		}
	})
}
