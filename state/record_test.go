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
		{FirstSeen: time.Unix(10, 0), Fingerprint: 3, Refreshed: time.Unix(20, 5)},
		{FirstSeen: time.Unix(10, 0), Fingerprint: 3, Version: 0, HasVersion: true},
		{FirstSeen: time.Unix(10, 0), Fingerprint: 3, Refreshed: time.Unix(0, 0), Version: 1<<64 - 1, HasVersion: true},
		{FirstSeen: time.Unix(10, 0), Fingerprint: 3, OutputSeq: 1},
		{FirstSeen: time.Unix(10, 0), Fingerprint: 3, Refreshed: time.Unix(20, 0), Version: 2, HasVersion: true, Forgotten: time.Unix(30, 0), OutputSeq: 1<<64 - 1},
	} {
		b := encodeRecord(r)
		got, err := decodeRecord(b)
		if err != nil || !got.FirstSeen.Equal(r.FirstSeen) || got.Fingerprint != r.Fingerprint ||
			!got.Refreshed.Equal(r.Refreshed) || got.Version != r.Version || got.HasVersion != r.HasVersion ||
			!got.Forgotten.Equal(r.Forgotten) || got.OutputSeq != r.OutputSeq {
			t.Errorf("round trip of %+v = %+v, %v", r, got, err)
		}
		if plain := r.Refreshed.IsZero() && !r.HasVersion && r.OutputSeq == 0; plain != (len(b) == recordLen && b[0] == recordVersion) {
			t.Errorf("%+v encodes as version %d, %d bytes: a record with no refresh, version or output sequence must stay version 1", r, b[0], len(b))
		}
	}
}

// TestDecodeRecordVersion1 reads a record as the releases before version 2
// wrote it: a store written by them still opens.
func TestDecodeRecordVersion1(t *testing.T) {
	b := []byte{1, 0x17, 0x97, 0x9c, 0xfe, 0x36, 0x2a, 0x00, 0x05, 0, 0, 0, 0, 0, 0, 0, 9}
	got, err := decodeRecord(b)
	if err != nil || !got.FirstSeen.Equal(time.Unix(1_700_000_000, 5)) || got.Fingerprint != 9 || got.HasVersion || !got.Refreshed.IsZero() {
		t.Fatalf("decodeRecord(%x) = %+v, %v", b, got, err)
	}
}

func TestWindowStartAndOlderThan(t *testing.T) {
	r := Record{FirstSeen: time.Unix(100, 0)}
	if !r.WindowStart().Equal(r.FirstSeen) || !r.OlderThan(0) {
		t.Fatalf("plain record: WindowStart %v, OlderThan(0) %v", r.WindowStart(), r.OlderThan(0))
	}
	r.Refreshed, r.Version, r.HasVersion = time.Unix(150, 0), 5, true
	if !r.WindowStart().Equal(r.Refreshed) || r.OlderThan(5) || r.OlderThan(4) || !r.OlderThan(6) {
		t.Fatalf("refreshed record at version 5: WindowStart %v, OlderThan(4,5,6) %v %v %v", r.WindowStart(), r.OlderThan(4), r.OlderThan(5), r.OlderThan(6))
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	good := encodeRecord(Record{FirstSeen: time.Unix(1, 0), Fingerprint: 1})
	wrongVersion := bytes.Clone(good)
	wrongVersion[0] = 3
	v2 := encodeRecord(Record{FirstSeen: time.Unix(1, 0), Fingerprint: 1, Version: 2, HasVersion: true})
	noFlags, unknownFlag := bytes.Clone(v2), bytes.Clone(v2)
	noFlags[1], unknownFlag[1] = 0, 0x84
	for name, b := range map[string][]byte{
		"empty":             nil,
		"short":             good[:16],
		"long":              append(bytes.Clone(good), 0),
		"wrong version":     wrongVersion,
		"version 2 short":   v2[:len(v2)-1],
		"version 2 long":    append(bytes.Clone(v2), 0),
		"version 2 no flag": noFlags,
		"unknown flag":      unknownFlag,
		"flags only":        {2},
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
	f.Add(encodeRecord(Record{FirstSeen: time.Unix(1_700_000_000, 5), Fingerprint: 9, Refreshed: time.Unix(1_700_000_100, 0)}))
	f.Add(encodeRecord(Record{FirstSeen: time.Unix(1_700_000_000, 5), Fingerprint: 9, Version: 7, HasVersion: true}))
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
