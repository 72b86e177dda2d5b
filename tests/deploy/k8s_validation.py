"""Offline validation of Kubernetes resources, as the API server would judge them.

Two passes over each resource, for every Kubernetes release whose schemas kubernetes-validate
ships:

1. kubernetes-validate's strict JSON schemas (the API's OpenAPI schemas: types, required fields,
   no unknown fields);
2. the API server's own checks that those schemas leave out, because they type a quantity and
   every name as "any string": resource quantities (k8s.io/apimachinery's resource.ParseQuantity
   grammar) and names (metadata names as DNS-1123 subdomains, a Service's as a DNS-1035 label,
   containers', volumes' and service ports' as DNS-1123 labels, container ports' as IANA service
   names, label keys and values, ConfigMap and Secret keys), with the rules and messages of
   k8s.io/apimachinery/pkg/util/validation. They are found where the API schema says the type is
   (a Quantity, an ObjectMeta, a Container...), so every field of that type is checked wherever
   it is.

Errors name the resource, the field path (spec.template.spec.containers[0].resources.limits.memory)
and the value.
"""

import copy
import re

import jsonschema
import referencing
from kubernetes_validate import utils as kv

# ---- the API server's rules (k8s.io/apimachinery/pkg/util/validation, api/resource) -------------

# resource.ParseQuantity: <signedNumber><suffix>, suffix a binary SI one (Ki..Ei), a decimal SI one
# (n, u, m, "", k, M, G, T, P, E) or a decimal exponent (e3, E-2). The API server's message quotes
# its looser regular expression; this is the grammar ParseQuantity accepts.
_QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")
_QUANTITY_MESSAGE = ("quantities must match the regular expression "
                     "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = _DNS1123_LABEL + r"(\." + _DNS1123_LABEL + ")*"
_DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(" + _QUALIFIED_NAME + ")?"
_CONFIG_MAP_KEY = "[-._a-zA-Z0-9]+"


def _full(pattern, value):
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def _dns1123_label(value):
    if not isinstance(value, str) or len(value) > 63:
        return "must be no more than 63 characters"
    if not _full(_DNS1123_LABEL, value):
        return ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
                "'-', and must start and end with an alphanumeric character (e.g. 'my-name', or "
                "'123-abc', regex used for validation is '" + _DNS1123_LABEL + "')")
    return None


def _dns1123_subdomain(value):
    if not isinstance(value, str) or len(value) > 253:
        return "must be no more than 253 characters"
    if not _full(_DNS1123_SUBDOMAIN, value):
        return ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character "
                "(e.g. 'example.com', regex used for validation is '" + _DNS1123_SUBDOMAIN + "')")
    return None


def _dns1035_label(value):
    if not isinstance(value, str) or len(value) > 63:
        return "must be no more than 63 characters"
    if not _full(_DNS1035_LABEL, value):
        return ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character (e.g. "
                "'my-name', or 'abc-123', regex used for validation is '" + _DNS1035_LABEL + "')")
    return None


def _iana_svc_name(value):
    if not isinstance(value, str) or len(value) > 15:
        return "must be no more than 15 characters"
    if not _full("[-a-z0-9]+", value):
        return "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"
    if "--" in value:
        return "must not contain consecutive hyphens"
    if not re.search("[a-z]", value):
        return "must contain at least one letter (a-z)"
    if value.startswith("-") or value.endswith("-"):
        return "must not begin or end with a hyphen"
    return None


def _qualified_name(value):
    if not isinstance(value, str):
        return "must be a string"
    prefix, _, name = value.rpartition("/")
    if prefix and _dns1123_subdomain(prefix):
        return "prefix part " + _dns1123_subdomain(prefix)
    if not name or len(name) > 63:
        return "name part must be non-empty and no more than 63 characters"
    if not _full(_QUALIFIED_NAME, name):
        return ("name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                "start and end with an alphanumeric character (e.g. 'MyName', or 'my.name', or "
                "'123-abc', regex used for validation is '" + _QUALIFIED_NAME + "')")
    return None


def _label_value(value):
    if not isinstance(value, str) or len(value) > 63:
        return "must be no more than 63 characters"
    if not _full(_LABEL_VALUE, value):
        return ("a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
                "'MyValue', or 'my_value', or '12345', regex used for validation is '"
                + _LABEL_VALUE + "')")
    return None


def _quantity(value):
    if isinstance(value, bool):
        return _QUANTITY_MESSAGE
    if isinstance(value, (int, float)):
        return None
    if not isinstance(value, str) or not _full(_QUANTITY, value):
        return _QUANTITY_MESSAGE
    return None


# A check of one value: (rule, key or None) → message or None. "keys:" rules check a map's keys
# (the error names the key), "labels" a map's keys and values.
def _check(rule, instance):
    """Yields (sub-path or None, value, message) for each violation of `rule` by `instance`."""
    single = {
        "quantity": _quantity,
        "dns1123-label": _dns1123_label,
        "dns1123-subdomain": _dns1123_subdomain,
        "iana-svc-name": _iana_svc_name,
    }
    if rule in single:
        if instance is None:
            return
        message = single[rule](instance)
        if message:
            yield None, instance, message
    elif rule == "labels":
        for key, value in (instance or {}).items():
            message = _qualified_name(key)
            if message:
                yield key, key, "label key: " + message
            message = _label_value(value)
            if message:
                yield key, value, message
    elif rule == "annotation-keys":
        for key in (instance or {}):
            message = _qualified_name(key)
            if message:
                yield key, key, "annotation key: " + message
    elif rule == "config-map-keys":
        for key in (instance or {}):
            if len(key) > 253 or not _full(_CONFIG_MAP_KEY, key):
                yield key, key, ("a valid config key must consist of alphanumeric characters, "
                                 "'-', '_' or '.' (e.g. 'key.name', or 'KEY_NAME', or "
                                 "'key-name', regex used for validation is '"
                                 + _CONFIG_MAP_KEY + "')")
    else:
        raise ValueError("unknown rule " + rule)


# Where the rules apply: (definition, property or None for the definition itself) → rule.
_RULES = {
    ("io.k8s.apimachinery.pkg.api.resource.Quantity", None): "quantity",
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "name"): "dns1123-subdomain",
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "labels"): "labels",
    ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "annotations"): "annotation-keys",
    ("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector", "matchLabels"): "labels",
    ("io.k8s.api.core.v1.Container", "name"): "dns1123-label",
    ("io.k8s.api.core.v1.Volume", "name"): "dns1123-label",
    ("io.k8s.api.core.v1.VolumeMount", "name"): "dns1123-label",
    ("io.k8s.api.core.v1.ContainerPort", "name"): "iana-svc-name",
    ("io.k8s.api.core.v1.ServicePort", "name"): "dns1123-label",
    ("io.k8s.api.core.v1.ConfigMap", "data"): "config-map-keys",
    ("io.k8s.api.core.v1.ConfigMap", "binaryData"): "config-map-keys",
    ("io.k8s.api.core.v1.Secret", "data"): "config-map-keys",
    ("io.k8s.api.core.v1.Secret", "stringData"): "config-map-keys",
}
# The kinds whose own name has a stricter rule than a DNS-1123 subdomain.
_TOP_LEVEL_NAME_RULES = {"Service": _dns1035_label, "Namespace": _dns1123_label}

_RULE_KEYWORD = "x-shardline-api-rule"


def _rule_keyword(validator, rule, instance, schema):
    for key, value, message in _check(rule, instance):
        error = jsonschema.ValidationError("Invalid value: %r: %s" % (value, message))
        if key is not None:
            error.path.appendleft(key)
        yield error


_ApiRulesValidator = jsonschema.validators.extend(
    jsonschema.validators.Draft202012Validator, {_RULE_KEYWORD: _rule_keyword})


def field_path(path):
    """spec.template.spec.containers[0].resources.limits.memory (a key with '.' or '/': [key])."""
    text = ""
    for item in path:
        if isinstance(item, int):
            text += "[%d]" % item
        elif "." in item or "/" in item:
            text += "[%s]" % item
        else:
            text += ("." if text else "") + item
    return text


def versions():
    """The Kubernetes releases kubernetes-validate has schemas for (1.25.0 ... 1.37.0)."""
    # all_versions() names each release twice: its plain and its strict schemas.
    return sorted(set(kv.all_versions()), key=lambda v: tuple(int(n) for n in v.split(".")))


_rules_schemas = {}


def _rules_definitions(version):
    """The version's definitions with the API rules marked on the types they apply to."""
    if version not in _rules_schemas:
        definitions = copy.deepcopy(kv.schema_contents(
            "kubernetes-json-schema/v%s-local-strict/_definitions.json" % version, version))
        defs = definitions["$defs"]
        for (name, prop), rule in _RULES.items():
            target = defs[name] if prop is None else defs[name]["properties"][prop]
            target[_RULE_KEYWORD] = rule
        _rules_schemas[version] = definitions
    return _rules_schemas[version]


def _describe(resource):
    metadata = resource.get("metadata") or {}
    return "%s/%s" % (resource.get("kind", "?"), metadata.get("name", "?"))


def validate(resource, version, source="<resource>"):
    """Returns the errors of one resource against one release: a list of one-line messages."""
    where = "%s: %s (Kubernetes %s)" % (source, _describe(resource), kv.major_minor(version))
    if not isinstance(resource, dict) or "apiVersion" not in resource or "kind" not in resource:
        return ["%s: not a Kubernetes resource (no apiVersion and kind)" % where]
    try:
        kv.validate(resource, version, strict=True)
    except kv.ValidationError as e:
        return ["%s: %s: %s" % (where, field_path(e.path) or "(top level)", e.message)]
    except kv.SchemaNotFoundError as e:
        return ["%s: %s" % (where, e.message)]

    api_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", resource["apiVersion"])
    schema = kv.schema_contents("kubernetes-json-schema/v%s-local-strict/%s-%s.json" % (
        version, resource["kind"].lower(), api_version), version)
    # The registry as kubernetes-validate builds it, with the marked definitions.
    registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
    registry = referencing.Resource.from_contents(_rules_definitions(version)) @ registry
    errors = []
    for error in _ApiRulesValidator(schema, registry=registry).iter_errors(resource):
        if error.validator == _RULE_KEYWORD:
            errors.append("%s: %s: %s" % (where, field_path(error.absolute_path), error.message))
    top_rule = _TOP_LEVEL_NAME_RULES.get(resource["kind"])
    name = (resource.get("metadata") or {}).get("name")
    if top_rule and name is not None and top_rule(name):
        errors.append("%s: metadata.name: Invalid value: %r: %s" % (where, name, top_rule(name)))
    return sorted(set(errors))


def validate_all(resources, source="<resources>"):
    """Every resource against every release; returns (errors, how many checks ran)."""
    errors, checks = [], 0
    for version in versions():
        for resource in resources:
            errors += validate(resource, version, source)
            checks += 1
    return errors, checks
