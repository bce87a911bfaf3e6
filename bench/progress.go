package bench

import (
	"fmt"
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress shows how far a harness run is: a bar on a terminal, one line
// per finished run elsewhere (logs, CI). It is used by one goroutine.
type progress struct {
	w           io.Writer
	bar         *progressbar.ProgressBar
	done, total int
}

// newProgress reports to w; nil reports nothing.
func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(f), progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true), progressbar.OptionClearOnFinish(),
			progressbar.OptionSetWidth(30), progressbar.OptionShowDescriptionAtLineEnd())
	}
	return p
}

// start says which run begins.
func (p *progress) start(label string) {
	if p.bar != nil {
		p.bar.Describe(label)
	}
}

// finish counts a run as done, with a one-line summary.
func (p *progress) finish(label, summary string) {
	p.done++
	switch {
	case p.bar != nil:
		_ = p.bar.Add(1)
	case p.w != nil:
		fmt.Fprintf(p.w, "[%d/%d] %s: %s\n", p.done, p.total, label, summary)
	}
}

// close clears the bar.
func (p *progress) close() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
