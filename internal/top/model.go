package top

import (
	"context"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/dedupe-stage/dedupe-stage/internal/admin"
)

// Fetch asks every instance for its status: admin.Client.Status.
type Fetch func(context.Context) ([]admin.StatusReply, error)

// Take asks fetch once and returns the sample.
func Take(ctx context.Context, fetch Fetch) Sample {
	at := time.Now()
	replies, err := fetch(ctx)
	if len(replies) > 0 {
		err = nil
	}
	return Sample{At: at, Replies: replies, Err: err}
}

// Model is the bubbletea model of the live view: it asks for a sample
// every interval, and renders the frame of the last two.
type Model struct {
	fetch    Fetch
	header   Header
	styles   Styles
	sort     Sort
	prev     Sample
	cur      Sample
	frame    Frame
	have     bool
	quitting bool
}

// NewModel returns the model that asks fetch every h.Interval, sorts by
// s and renders with st.
func NewModel(fetch Fetch, h Header, s Sort, st Styles) Model {
	return Model{fetch: fetch, header: h, styles: st, sort: s}
}

// sampleMsg carries a sample to Update.
type sampleMsg Sample

// tickMsg asks for the next sample.
type tickMsg struct{}

// take is the command that takes a sample.
func (m Model) take() tea.Cmd {
	fetch := m.fetch
	return func() tea.Msg { return sampleMsg(Take(context.Background(), fetch)) }
}

// Init implements tea.Model: it takes the first sample.
func (m Model) Init() tea.Cmd { return m.take() }

// Update implements tea.Model.
func (m Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case sampleMsg:
		wait := m.header.Interval - time.Since(msg.At)
		m.prev, m.cur, m.have = m.cur, Sample(msg), true
		m.frame = Build(m.prev, m.cur)
		m.sort.Apply(&m.frame)
		return m, tea.Tick(max(wait, 0), func(time.Time) tea.Msg { return tickMsg{} })
	case tickMsg:
		return m, m.take()
	case tea.KeyMsg:
		return m.key(msg.String())
	}
	return m, nil
}

// key handles a key: quit, or change the sort.
func (m Model) key(k string) (tea.Model, tea.Cmd) {
	switch k {
	case "q", "ctrl+c", "esc":
		m.quitting = true
		return m, tea.Quit
	case "s", "right", "tab":
		m.sort = m.sort.Next(1)
	case "S", "left", "shift+tab":
		m.sort = m.sort.Next(-1)
	case "r":
		m.sort.Desc = !m.sort.Desc
	default:
		if len(k) == 1 && k[0] >= '1' && k[0] < '1'+byte(columns) {
			m.sort = Sort{By: Column(k[0] - '1'), Desc: k[0] != '1'}
		}
	}
	m.sort.Apply(&m.frame)
	return m, nil
}

// SortBy returns the model's sort.
func (m Model) SortBy() Sort { return m.sort }

// View implements tea.Model.
func (m Model) View() string {
	if m.quitting {
		return ""
	}
	if !m.have {
		return "asking the instances on " + m.header.Subject + " ...\n"
	}
	return Render(m.frame, m.header, m.sort, m.styles, true)
}

// Once takes two samples interval apart, so that the frame has rates,
// and returns it rendered with st, without the keys' help.
func Once(ctx context.Context, fetch Fetch, h Header, s Sort, st Styles) (string, Frame, error) {
	first := Take(ctx, fetch)
	if first.Err != nil {
		return "", Frame{}, first.Err
	}
	select {
	case <-time.After(h.Interval):
	case <-ctx.Done():
		return "", Frame{}, ctx.Err()
	}
	second := Take(ctx, fetch)
	if second.Err != nil {
		return "", Frame{}, second.Err
	}
	f := Build(first, second)
	s.Apply(&f)
	return Render(f, h, s, st, false), f, nil
}
