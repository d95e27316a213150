package keys

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// benchPayload is a realistic ~300 byte webhook event whose key,
// meta.event_id, sits near the end.
var benchPayload = []byte(`{"type":"order.updated","created_at":"2024-05-01T12:34:56.789Z",` +
	`"data":{"order_id":"ord_8f2c91","customer":{"id":"cus_19ab","email":"a.user@example.com"},` +
	`"items":[{"sku":"SKU-1","qty":2,"price":19.99},{"sku":"SKU-2","qty":1,"price":5.5}],` +
	`"note":"leave at the door, \"back\" entrance"},` +
	`"meta":{"source":"shop-eu","attempt":3,"event_id":"evt_01HX3M8Q2W7K9D6R5T4V"}}`)

const benchPath = "meta.event_id"

func benchHeader() nats.Header {
	return nats.Header{
		"Content-Type":       {"application/json"},
		"Nats-Msg-Id":        {"evt_01HX3M8Q2W7K9D6R5T4V"},
		"Webhook-Source":     {"shop-eu"},
		"Traceparent":        {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		"X-Request-Id":       {"req-123"},
		"Nats-Expected-Last": {"12"},
	}
}

func BenchmarkExtractHeader(b *testing.B) {
	e := mustExtractor(b, FieldSpec{Source: SourceHeader, Header: "Nats-Msg-Id"})
	hdr := benchHeader()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.Extract("events.shop.order", hdr, benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExtractHeaderCaseInsensitive measures the fallback scan taken when
// the sender's header name differs in case from the configured one.
func BenchmarkExtractHeaderCaseInsensitive(b *testing.B) {
	e := mustExtractor(b, FieldSpec{Source: SourceHeader, Header: "nats-msg-id"})
	hdr := benchHeader()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.Extract("events.shop.order", hdr, benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExtractJSON(b *testing.B) {
	e := mustExtractor(b, FieldSpec{Source: SourceJSON, JSONPath: benchPath})
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.Extract("events.shop.order", nil, benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExtractJSONDecoderTokens is the alternative to the scanner:
// encoding/json's Decoder token stream, walking to the same field.
func BenchmarkExtractJSONDecoderTokens(b *testing.B) {
	path := strings.Split(benchPath, ".")
	want := "evt_01HX3M8Q2W7K9D6R5T4V"
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		got, err := decoderTokensExtract(benchPayload, path)
		if err != nil || string(got) != want {
			b.Fatalf("got %q, %v", got, err)
		}
	}
}

// BenchmarkExtractJSONUnmarshalMap is the naive alternative: decode the whole
// payload into a map.
func BenchmarkExtractJSONUnmarshalMap(b *testing.B) {
	b.SetBytes(int64(len(benchPayload)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var m map[string]any
		if err := json.Unmarshal(benchPayload, &m); err != nil {
			b.Fatal(err)
		}
		if _, ok := m["meta"].(map[string]any)["event_id"].(string); !ok {
			b.Fatal("missing")
		}
	}
}

// decoderTokensExtract walks data with json.Decoder.Token to the string at
// path (benchmark comparison only).
func decoderTokensExtract(data []byte, path []string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	for depth, seg := range path {
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return nil, errors.New("not an object")
		}
		for {
			t, err := dec.Token()
			if err != nil {
				return nil, err
			}
			name, ok := t.(string)
			if !ok {
				return nil, errors.New("absent")
			}
			if name == seg {
				break
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, err
			}
		}
		if depth == len(path)-1 {
			t, err := dec.Token()
			if err != nil {
				return nil, err
			}
			s, ok := t.(string)
			if !ok {
				return nil, errors.New("not a string")
			}
			return []byte(s), nil
		}
	}
	return nil, errors.New("unreachable")
}

func BenchmarkExtractSubject(b *testing.B) {
	e := mustExtractor(b, FieldSpec{Source: SourceSubject, SubjectToken: -1})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.Extract("events.shop-eu.orders.evt_01HX3M8Q2W7K9D6R5T4V", nil, benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKeyScoped is the full per-message key: JSON key scoped by a header.
func BenchmarkKeyScoped(b *testing.B) {
	kf, err := NewKeyFunc(KeyConfig{
		Field: FieldSpec{Source: SourceJSON, JSONPath: benchPath},
		Scope: FieldSpec{Source: SourceHeader, Header: "Webhook-Source"},
	})
	if err != nil {
		b.Fatal(err)
	}
	hdr := benchHeader()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := kf.Key("events.shop.order", hdr, benchPayload); err != nil {
			b.Fatal(err)
		}
	}
}
