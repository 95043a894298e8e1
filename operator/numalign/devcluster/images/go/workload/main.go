// Command workload is the default program of numalign.local/workload:dev.
//
//	workload            print this process's Cpus_allowed_list and Mems_allowed_list
//	                    lines of /proc/self/status, then sleep until SIGTERM or SIGINT
//	workload status     print the same lines and exit (for kubectl exec)
//	workload cat FILE.. print files (the image has no shell; for kubectl exec)
//
// The lines are printed exactly as the kernel writes them, e.g.
// "Cpus_allowed_list:\t1", so a test can compare them with what the kubelet assigned.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

var fields = []string{"Cpus_allowed_list:", "Mems_allowed_list:"}

func printStatus(w io.Writer) error {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return err
	}
	defer f.Close()
	found := map[string]string{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := scanner.Text()
		for _, name := range fields {
			if strings.HasPrefix(line, name) {
				found[name] = line
			}
		}
	}
	if err := scanner.Err(); err != nil {
		return err
	}
	for _, name := range fields {
		line, ok := found[name]
		if !ok {
			return fmt.Errorf("/proc/self/status has no %s line", name)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

func cat(paths []string) int {
	code := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "workload: %v\n", err)
			code = 1
			continue
		}
		os.Stdout.Write(data)
	}
	return code
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 {
		switch args[0] {
		case "status":
			if err := printStatus(os.Stdout); err != nil {
				fmt.Fprintf(os.Stderr, "workload: %v\n", err)
				os.Exit(1)
			}
			return
		case "cat":
			os.Exit(cat(args[1:]))
		default:
			fmt.Fprintf(os.Stderr, "workload: unknown command %q (status, cat FILE...)\n", args[0])
			os.Exit(2)
		}
	}
	// Listen before printing: whoever reads the lines may signal right away.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	if err := printStatus(os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "workload: %v\n", err)
		os.Exit(1)
	}
	sig := <-signals
	fmt.Fprintf(os.Stderr, "workload: %v, exiting\n", sig)
}
