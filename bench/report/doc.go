// Package report turns the benchmark harness's runs into what people read
// and plot: a Markdown table with the strategies side by side, JSON, CSV
// and PNG charts. Every report names the machine and software it ran on
// and the exact command line.
package report
