package chartpolicy

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// policy renders the chart's ValidatingAdmissionPolicy whose name ends in suffix from template.
func policy(t *testing.T, template, suffix string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	for _, doc := range renderTemplate(t, template, nil) {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			continue // another kind
		}
		if p.Kind == "ValidatingAdmissionPolicy" && strings.HasSuffix(p.Name, suffix) {
			return &p
		}
	}
	t.Fatalf("%s renders no ValidatingAdmissionPolicy named *%s", template, suffix)
	return nil
}

// evaluator compiles a policy the way the API server's ValidatingAdmissionPolicy plugin does
// (k8s.io/apiserver's validating.compilePolicy, which is not exported: the same compiler,
// environment and accessors) and evaluates it on one request.
type evaluator struct {
	validator validating.Validator
}

func compile(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) evaluator {
	t.Helper()
	vars := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	messageVars := cel.OptionalVariableDeclarations{}
	compiler, err := cel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	variables := make([]cel.NamedExpressionAccessor, len(p.Spec.Variables))
	for i, v := range p.Spec.Variables {
		variables[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	compiler.CompileAndStoreVariables(variables, vars, environment.StoredExpressions)
	matches := make([]cel.ExpressionAccessor, len(p.Spec.MatchConditions))
	for i := range p.Spec.MatchConditions {
		matches[i] = (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i])
	}
	validations := make([]cel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]cel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		validations[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		if v.MessageExpression != "" {
			messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
		}
	}
	matcher := matchconditions.NewMatcher(compiler.CompileCondition(matches, vars, environment.StoredExpressions),
		p.Spec.FailurePolicy, "policy", "validate", p.Name)
	v := validating.NewValidator(compiler.CompileCondition(validations, vars, environment.StoredExpressions), matcher,
		compiler.CompileCondition(nil, vars, environment.StoredExpressions),
		compiler.CompileCondition(messages, messageVars, environment.StoredExpressions), p.Spec.FailurePolicy, nil)
	if err := v.CompileError(); err != nil {
		t.Fatalf("compile %s: %v", p.Name, err)
	}
	// A compile error of one expression shows at evaluation, as an error decision.
	return evaluator{validator: v}
}

// request is one admission request the policy sees.
type request struct {
	operation   admission.Operation
	resource    schema.GroupVersionResource
	subresource string
	kind        schema.GroupVersionKind
	namespace   string
	name        string
	object, old runtime.Object
	user        user.Info
}

// denial evaluates the policy on r and returns the message of its first denial ("" when
// admitted) and whether the policy's match conditions selected the request; an evaluation
// error fails the test (the policy's failurePolicy is Fail: the API server would refuse the
// request with that error).
func (e evaluator) denial(t *testing.T, r request) (string, bool) {
	t.Helper()
	attrs := admission.NewAttributesRecord(r.object, r.old, r.kind, r.namespace, r.name, r.resource, r.subresource,
		r.operation, nil, false, r.user)
	versioned := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: r.kind,
		VersionedObject: admission.NewLazyObject(r.object), VersionedOldObject: admission.NewLazyObject(r.old)}
	result := e.validator.Validate(context.Background(), r.resource, versioned, nil, nil, celconfig.RuntimeCELCostBudget, nil)
	if len(result.Decisions) == 0 {
		return "", false
	}
	for _, d := range result.Decisions {
		if d.Evaluation == validating.EvalError {
			t.Fatalf("the policy failed to evaluate: %s", d.Message)
		}
		if d.Action == validating.ActionDeny {
			return d.Message, true
		}
	}
	return "", true
}
