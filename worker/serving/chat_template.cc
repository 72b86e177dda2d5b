// Python's C API stays in this file. Every call into Python holds its lock (the GIL): the thread
// that starts Python releases it at once, and Render takes it with PyGILState_Ensure.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
// (Python.h first, as its documentation asks: it sets feature macros the C library reads.)
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/serving/chat_template.h"

namespace shardline::serving {
namespace {

using nlohmann::json;

// The part written in Python: transformers' rendering environment (chat_template.h lists what
// it has) and two entry points that never raise, so that the C++ side reads plain tuples.
//   compile(source) -> (template, "") or (None, "line N: what is wrong")
//   render(template, messages_json, variables_json, add_generation_prompt)
//       -> ("", text) or ("raised", the template's message) or ("failed", "what, line N")
constexpr const char* kEngineSource = R"py(
import datetime
import json

import jinja2
import jinja2.ext
import jinja2.sandbox


class _Raised(jinja2.exceptions.TemplateError):
    """What raise_exception raises: the template's own refusal, told to the client as it is."""


def _raise_exception(message):
    raise _Raised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates want the plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.datetime.now().strftime(format)


class _GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} marks the assistant's text for training masks;
    rendering a prompt keeps its body as it is."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _template_line(error):
    line = getattr(error, "lineno", None)
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def compile(source):
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return (env.from_string(source), "")
    except jinja2.exceptions.TemplateSyntaxError as e:
        return (None, "line %s: %s" % (e.lineno, e.message))
    except Exception as e:
        return (None, "%s: %s" % (type(e).__name__, e))


def render(template, messages, variables, add_generation_prompt):
    try:
        return ("", template.render(messages=json.loads(messages), tools=None, documents=None,
                                    add_generation_prompt=add_generation_prompt,
                                    **json.loads(variables)))
    except _Raised as e:
        return ("raised", str(e.message))
    except Exception as e:
        line = _template_line(e)
        where = "" if line is None else " (line %d of the template)" % line
        return ("failed", "%s: %s%s" % (type(e).__name__, e, where))
)py";

// Owns one reference; destroyed with the GIL held.
struct PyRef {
  PyObject* p = nullptr;
  explicit PyRef(PyObject* o) : p(o) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { Py_XDECREF(p); }
};

// The pending Python exception as "Type: message" (and clears it). GIL held.
std::string TakePythonError() {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  PyRef t(type), v(value), tb(traceback);
  std::string out = "unknown Python error";
  if (t.p != nullptr) {
    PyRef name(PyObject_GetAttrString(t.p, "__name__"));
    const char* n = name.p != nullptr ? PyUnicode_AsUTF8(name.p) : nullptr;
    out = n != nullptr ? n : "exception";
  }
  if (v.p != nullptr) {
    PyRef text(PyObject_Str(v.p));
    const char* s = text.p != nullptr ? PyUnicode_AsUTF8(text.p) : nullptr;
    if (s != nullptr) absl::StrAppend(&out, ": ", s);
  }
  PyErr_Clear();
  return out;
}

// The str `o` as UTF-8; nullopt (the error cleared) when it is not a str. GIL held.
std::optional<std::string> Utf8(PyObject* o) {
  Py_ssize_t size = 0;
  const char* data = o != nullptr ? PyUnicode_AsUTF8AndSize(o, &size) : nullptr;
  if (data == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  return std::string(data, static_cast<size_t>(size));
}

// Python with kEngineSource run, started once in a process: its compile and render functions.
struct Engine {
  PyObject* compile = nullptr;  // owned for the process's life
  PyObject* render = nullptr;
};

absl::StatusOr<Engine> StartEngine() {
  // Python may already run in this process (a host that embeds it too): then it is used as it is.
  const bool started_here = !Py_IsInitialized();
  if (started_here) {
    PyConfig config;
    // Isolated: PYTHONPATH, PYTHONHOME and the user's site-packages cannot swap in another jinja2
    // or another Python's standard library.
    PyConfig_InitIsolatedConfig(&config);
    // The process keeps its own SIGINT and SIGTERM handlers.
    config.install_signal_handlers = 0;
    // The interpreter this libpython belongs to (Debian's), so that the standard library and
    // dist-packages are found beside it, not beside whatever `python3` PATH finds first.
    PyStatus status =
        PyConfig_SetBytesString(&config, &config.program_name, SHARDLINE_PYTHON_EXECUTABLE);
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "chat templates: starting the embedded Python (", SHARDLINE_PYTHON_EXECUTABLE,
          ") failed: ", status.err_msg != nullptr ? status.err_msg : "no reason given"));
    }
  }
  const PyGILState_STATE gil = PyGILState_Ensure();
  Engine engine;
  std::string error;
  PyObject* globals = PyDict_New();  // kept: the functions' module namespace
  if (globals == nullptr ||
      PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) != 0) {
    error = TakePythonError();
  } else {
    PyRef ran(PyRun_String(kEngineSource, Py_file_input, globals, globals));
    if (ran.p == nullptr) {
      error = TakePythonError();
    } else {
      engine.compile = PyDict_GetItemString(globals, "compile");  // borrowed from `globals`
      engine.render = PyDict_GetItemString(globals, "render");
      if (engine.compile == nullptr || engine.render == nullptr) error = "no compile or render";
    }
  }
  PyGILState_Release(gil);
  // The thread that started Python holds its lock until it lets go of it here.
  if (started_here) PyEval_SaveThread();
  if (!error.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chat templates need Python's jinja2 (Debian package python3-jinja2, which "
                     "scripts/install-deps.sh installs) in the Python of ",
                     SHARDLINE_PYTHON_EXECUTABLE, ": ", error));
  }
  return engine;
}

const absl::StatusOr<Engine>& TheEngine() {
  static const absl::StatusOr<Engine>* const engine = new absl::StatusOr<Engine>(StartEngine());
  return *engine;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a file"));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::DataLossError(absl::StrCat(path, ": cannot be read"));
  return text.str();
}

// The tokens transformers hands a template (its special_tokens_map): each a string, or an
// AddedToken object {"content": ...}; null or absent ones are left out, as transformers leaves
// them out.
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

absl::Status ReadSpecialTokens(const json& config, const std::string& where,
                               std::map<std::string, std::string>& out) {
  for (const char* name : kSpecialTokens) {
    if (out.count(name) > 0) continue;
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) {
      out[name] = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      out[name] = (*it)["content"].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": \"", name, "\" must be a string or an object with a string \"content\", got ",
          it->dump()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ReadJsonObject(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a JSON object, got ", j.type_name()));
  }
  return j;
}

// The config's "chat_template": a string, or the "default" of a list of named templates.
absl::StatusOr<std::string> TemplateOfConfig(const json& config, const std::string& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(
        absl::StrCat(path,
                     " has no \"chat_template\" (and there is no chat_template.jinja beside "
                     "it): the model has no chat template"));
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": \"chat_template\" must be a string or a list of {\"name\", \"template\"}, got ",
        it->type_name()));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& entry = (*it)[i];
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"chat_template\"[", i,
                       "] must be an object with a string \"name\" and \"template\""));
    }
    const std::string name = entry["name"].get<std::string>();
    if (name == "default") return entry["template"].get<std::string>();
    names.push_back(absl::StrCat("'", name, "'"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": \"chat_template\" lists templates named ", absl::StrJoin(names, ", "),
                   " but none named 'default', the one chat completions use"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromTokenizerConfig(
    const std::string& config_path) {
  ASSIGN_OR_RETURN(const json config, ReadJsonObject(config_path));
  const std::filesystem::path dir = std::filesystem::path(config_path).parent_path();
  std::map<std::string, std::string> variables;
  RETURN_IF_ERROR(ReadSpecialTokens(config, config_path, variables));
  const std::string map_path = (dir / "special_tokens_map.json").string();
  if (std::filesystem::exists(map_path)) {
    ASSIGN_OR_RETURN(const json map, ReadJsonObject(map_path));
    RETURN_IF_ERROR(ReadSpecialTokens(map, map_path, variables));
  }
  // transformers reads chat_template.jinja, when a folder has it, in place of the config's.
  const std::string jinja_path = (dir / "chat_template.jinja").string();
  if (std::filesystem::exists(jinja_path)) {
    ASSIGN_OR_RETURN(const std::string source, ReadFile(jinja_path));
    return Create(source, std::move(variables), jinja_path);
  }
  ASSIGN_OR_RETURN(const std::string source, TemplateOfConfig(config, config_path));
  return Create(source, std::move(variables), config_path);
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(
    const std::string& source, std::map<std::string, std::string> variables, std::string origin) {
  const absl::StatusOr<Engine>& engine = TheEngine();
  if (!engine.ok()) return engine.status();
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* compiled = nullptr;
  std::string error;
  {
    PyRef result(PyObject_CallFunction(engine->compile, "s#", source.data(),
                                       static_cast<Py_ssize_t>(source.size())));
    if (result.p == nullptr) {
      error = TakePythonError();
    } else if (!PyTuple_Check(result.p) || PyTuple_Size(result.p) != 2) {
      error = "compile gave no pair";
    } else if (PyTuple_GetItem(result.p, 0) == Py_None) {
      error = Utf8(PyTuple_GetItem(result.p, 1)).value_or("a syntax error");
    } else {
      compiled = PyTuple_GetItem(result.p, 0);
      Py_INCREF(compiled);
    }
  }
  PyGILState_Release(gil);
  if (compiled == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": the chat template is not valid Jinja: ", error));
  }
  return std::unique_ptr<ChatTemplate>(
      new ChatTemplate(compiled, std::move(variables), std::move(origin)));
}

ChatTemplate::ChatTemplate(void* compiled, std::map<std::string, std::string> variables,
                           std::string origin)
    : compiled_(compiled),
      variables_(std::move(variables)),
      variables_json_(json(variables_).dump(-1, ' ', false, json::error_handler_t::replace)),
      origin_(std::move(origin)) {}

ChatTemplate::~ChatTemplate() {
  const PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(static_cast<PyObject*>(compiled_));
  PyGILState_Release(gil);
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  // Each message a dict in the order clients write it (role, then content), as a template's
  // `message | tojson` shows it.
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  // Text that is not UTF-8 cannot become a Python str: it is sent with U+FFFD in its place.
  const std::string messages_json =
      list.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  const Engine& engine = *TheEngine();  // ok: this template was compiled by it
  std::string kind, text;
  const PyGILState_STATE gil = PyGILState_Ensure();
  {
    PyRef result(PyObject_CallFunction(
        engine.render, "Os#s#O", static_cast<PyObject*>(compiled_), messages_json.data(),
        static_cast<Py_ssize_t>(messages_json.size()), variables_json_.data(),
        static_cast<Py_ssize_t>(variables_json_.size()),
        add_generation_prompt ? Py_True : Py_False));
    if (result.p == nullptr) {
      kind = "failed";
      text = TakePythonError();
    } else if (!PyTuple_Check(result.p) || PyTuple_Size(result.p) != 2) {
      kind = "failed";
      text = "render gave no pair";
    } else {
      kind = Utf8(PyTuple_GetItem(result.p, 0)).value_or("failed");
      std::optional<std::string> second = Utf8(PyTuple_GetItem(result.p, 1));
      if (!second.has_value()) {
        kind = "failed";
        text = "the template rendered text that is not valid Unicode";
      } else {
        text = std::move(*second);
      }
    }
  }
  PyGILState_Release(gil);
  if (kind.empty()) return text;
  if (kind == "raised") {
    return absl::InvalidArgumentError(
        absl::StrCat("the chat template (", origin_, ") refused the messages: ", text));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rendering the chat template (", origin_, ") failed: ", text));
}

}  // namespace shardline::serving
