// motor-client: Motor's gRPC API from Go, with stubs generated from protos/ (clients/go/generate.sh).
//
//	clients/go/motor-client .motor/fleet.json
//
// Prints one JSON line per check; exits 1 on the first failed check.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	controllerv1 "motor/clients/go/gen/motor/controller/v1"
	coordinatorv1 "motor/clients/go/gen/motor/coordinator/v1"
)

type tlsFiles struct {
	CaFile   string `json:"ca_file"`
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
}

type fleet struct {
	Controller        string    `json:"controller"`
	Coordinators      []string  `json:"coordinators"`
	ManagementKeyFile string    `json:"management_key_file"`
	InferenceKeyFile  string    `json:"inference_key_file"`
	TLS               *tlsFiles `json:"tls"`
}

func report(check string, fields map[string]any) {
	fields["check"] = check
	line, _ := json.Marshal(fields)
	fmt.Println(string(line))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// snippet: channel
// dial: plaintext, or (motor up --tls) TLS with the fleet CA and the client certificate mutual TLS asks for.
func dial(address string, files *tlsFiles) *grpc.ClientConn {
	security := grpc.WithInsecure()
	if files != nil {
		ca, err := os.ReadFile(files.CaFile)
		if err != nil {
			fail(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		cert, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
		if err != nil {
			fail(err)
		}
		security = grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}))
	}
	conn, err := grpc.Dial(address, security)
	if err != nil {
		fail(err)
	}
	return conn
}

// end snippet

// snippet: reason
// reason returns the google.rpc.ErrorInfo reason carried in a gRPC error's details.
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

// end snippet

func main() {
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	var f fleet
	if err := json.Unmarshal(raw, &f); err != nil {
		fail(err)
	}
	// snippet: metadata
	// Management calls carry the operator key as metadata; base holds the deadline of every call.
	key, err := os.ReadFile(f.ManagementKeyFile)
	if err != nil {
		fail(err)
	}
	base, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := metadata.AppendToOutgoingContext(base, "x-motor-management-key", strings.TrimSpace(string(key)))
	// end snippet

	ctlConn := dial(f.Controller, f.TLS)
	h, err := healthpb.NewHealthClient(ctlConn).Check(base, &healthpb.HealthCheckRequest{})
	if err != nil {
		fail(err)
	}
	report("health", map[string]any{"status": h.Status.String()})

	managed, err := controllerv1.NewControllerAdminServiceClient(ctlConn).ListInstances(admin, &controllerv1.ListInstancesRequest{})
	if err != nil {
		fail(err)
	}
	ids := []string{}
	for _, m := range managed.Instances {
		ids = append(ids, fmt.Sprint(m.Instance.Id))
	}
	report("controller.ListInstances", map[string]any{"ids": ids})

	// snippet: registry
	coordConn := dial(f.Coordinators[0], f.TLS)
	registry := coordinatorv1.NewInstanceRegistryServiceClient(coordConn)
	listed, err := registry.ListInstances(admin, &coordinatorv1.ListInstancesRequest{})
	if err != nil {
		fail(err)
	}
	id := listed.Instances[0].Id
	got, err := registry.GetInstance(admin, &coordinatorv1.GetInstanceRequest{InstanceId: id})
	if err != nil {
		fail(err)
	}
	if got.Instance.Id != id {
		fail(fmt.Errorf("GetInstance(%d) answered %d", id, got.Instance.Id))
	}
	report("coordinator.GetInstance", map[string]any{"id": fmt.Sprint(id), "role": got.Instance.Role.String(), "listed": len(listed.Instances)})
	// end snippet

	// snippet: dispatch
	// DispatchService takes an inference key, not the management (operator) key.
	inferenceKey, err := os.ReadFile(f.InferenceKeyFile)
	if err != nil {
		fail(err)
	}
	app := metadata.AppendToOutgoingContext(base, "authorization", "Bearer "+strings.TrimSpace(string(inferenceKey)))
	body := []byte(`{"model": "tiny", "prompt": "Hello", "max_tokens": 4, "stream": true}`)
	stream, err := coordinatorv1.NewDispatchServiceClient(coordConn).Dispatch(app, &coordinatorv1.DispatchRequest{
		RequestId: "go-client-1", Api: coordinatorv1.OpenAiApi_OPEN_AI_API_COMPLETIONS, Body: body,
	})
	if err != nil {
		fail(err)
	}
	var httpStatus uint32
	frames, text := 0, ""
	for {
		frame, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(err)
		}
		frames++
		if head := frame.GetHead(); head != nil {
			httpStatus = head.HttpStatus
		} else {
			text += string(frame.GetChunk())
		}
	}
	report("coordinator.Dispatch", map[string]any{"http_status": httpStatus, "frames": frames, "done": strings.Contains(text, "[DONE]")})
	// end snippet

	_, err = registry.GetInstance(admin, &coordinatorv1.GetInstanceRequest{InstanceId: 1<<53 - 1})
	if err == nil {
		fail(fmt.Errorf("GetInstance of an unknown id succeeded"))
	}
	report("error", map[string]any{"code": strings.ToUpper(codeName(status.Code(err).String())), "reason": reason(err)})
}

// codeName turns grpc-go's "NotFound" into the canonical "NOT_FOUND".
func codeName(camel string) string {
	var b strings.Builder
	for i, r := range camel {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}
