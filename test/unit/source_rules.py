#!/usr/bin/env python3
"""The rules of jobcap's C++ sources that a compiler does not check, checked here (CTest runs
this: `test/run unit`). Exits 1 and names each place that breaks one:

 plain-data   Frames that call PostgreSQL hold plain data only (ereport is a longjmp that skips
              destructors: src/boundary.hpp), so no owning C++ container, string or smart pointer
              outside the pure core (src/core): neither its header nor its name.
 tiers        Includes go down the tiers only, never up or sideways, so the include graph has no
              cycle (docs/architecture.md draws it).
 compat       Every piece of code that serves a database still at jobcap 0.1.0 carries the tag
              compat(0.1.0) on its line or in the comment just above it (UPDATING.md); code
              that serves one still at 0.2.0, the tag compat(0.2.0). An argument count
              (PG_NARGS) tells a declaration of either, and carries either tag.
 versions     Only src/compat.hpp tests PG_VERSION_NUM: a difference between PostgreSQL majors
              gets a shim there, named for what it does.
 size         No C++ source is longer than 700 lines, none of src/direct longer than 500.
 paths        Every jobcap file a comment names exists.

Usage: test/unit/source_rules.py [ROOT]   (ROOT: the checkout, by default this file's ../..)
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), '..', '..'))
SRC = os.path.join(ROOT, 'src')

# Owning containers, strings, smart pointers and the like: their destructors must run.
OWNING_HEADERS = {'string', 'vector', 'memory', 'map', 'unordered_map', 'set', 'unordered_set',
                  'list', 'forward_list', 'deque', 'queue', 'stack', 'functional', 'sstream',
                  'iostream', 'istream', 'ostream', 'fstream', 'regex', 'any', 'thread',
                  'mutex', 'future', 'optional', 'variant'}
OWNING_NAMES = re.compile(r'\bstd::(string|wstring|vector|unique_ptr|shared_ptr|make_unique|'
                          r'make_shared|function|map|unordered_map|set|unordered_set|list|'
                          r'forward_list|deque|queue|stack|stringstream|ostringstream|'
                          r'istringstream|regex|any|optional|variant)\b')

# The tiers, lowest first. A file may include its own directory's headers and those of lower
# tiers. Top-level files are placed one by one.
TIERS = {
    'core': 0,
    'pg.hpp': 1, 'compat.hpp': 1, 'jobcap.hpp': 1,
    'spi': 2,
    'direct': 3, 'housekeeping': 3,
    'boundary.hpp': 4, 'boundary.cpp': 4, 'background': 4,
    'functions': 5,
    'jobcap.cpp': 6,
}

# The 0.1.0 compatibility code: the schema probes, the argument counts of the 0.1.0
# declarations, and the statements of the 0.1.0 schema.
COMPAT = re.compile(r'\b(queues_paused_column_exists|job_schedules_table_exists)\(\)|'
                    r'\bPG_NARGS\(\)|JOBCAP_STATEMENT\(\s*\w+_0_1\b|#define\s+\w+_0_1\b')
# The 0.2.0 compatibility code: its schema probe and the statements of the 0.2.0 schema.
COMPAT_0_2 = re.compile(r'\b(workflows_schema_exists|flow_schema_exists)\(\)|JOBCAP_STATEMENT\(\s*\w+_0_2\b|'
                        r'#define\s+\w+_0_2\b')

# A jobcap file named in a comment: under src/ (its directory may be left out), docs/, test/ or
# bench/. PostgreSQL's own paths (src/backend, src/include, src/test, ...) are not jobcap's.
BARE = re.compile(r'(?<![\w/.])(\w+\.(?:cpp|hpp))\b')
NAMED = re.compile(r'(?<![\w/.])((?:src/)?(?:core|spi|direct|functions|background|housekeeping)/'
                   r'\w+\.(?:cpp|hpp)|src/\w+\.(?:cpp|hpp)|(?:docs|test|bench)/[\w/.-]*\w)')


def sources():
    for d, _, files in sorted(os.walk(SRC)):
        for f in sorted(files):
            if f.endswith(('.cpp', '.hpp')):
                yield os.path.join(d, f)


def tier_of(rel):
    """rel: a path under src/ ('spi/plans.hpp', 'boundary.hpp')."""
    head = rel.split('/')[0]
    return TIERS.get(head), head


def comments(line):
    i = line.find('//')
    return line[i + 2:] if i >= 0 else ''


def main():
    problems = []
    known = {f for _, _, files in os.walk(SRC) for f in files}
    known |= set(os.listdir(os.path.join(ROOT, 'test', 'unit')))
    for path in sources():
        rel = os.path.relpath(path, SRC)
        where = os.path.relpath(path, ROOT)
        lines = open(path, encoding='utf-8').read().split('\n')
        in_core = rel.startswith('core/')
        tier, home = tier_of(rel)
        if tier is None:
            problems.append(f'{where}: tiers: src/{home} has no tier in test/unit/source_rules.py')
        limit = 500 if rel.startswith('direct/') else 700
        if len(lines) - 1 > limit:
            problems.append(f'{where}: size: {len(lines) - 1} lines, more than {limit}')
        for n, line in enumerate(lines, 1):
            code = line.split('//')[0]
            m = re.match(r'\s*#\s*include\s*([<"])([^>"]+)[>"]', line)
            if m and m.group(1) == '<' and m.group(2) in OWNING_HEADERS and not in_core:
                problems.append(f'{where}:{n}: plain-data: <{m.group(2)}> outside src/core')
            if not in_core and OWNING_NAMES.search(code):
                problems.append(f'{where}:{n}: plain-data: {OWNING_NAMES.search(code).group(0)} '
                                'outside src/core')
            if m and m.group(1) == '"' and os.path.exists(os.path.join(SRC, m.group(2))):
                target = m.group(2)
                t, target_home = tier_of(target)
                top_level = '/' not in rel and '/' not in target
                same_dir = '/' in rel and os.path.dirname(rel) == os.path.dirname(target)
                down = t is not None and tier is not None and (t < tier or
                                                               (top_level and t <= tier))
                if not same_dir and not down:
                    problems.append(f'{where}:{n}: tiers: src/{rel} (tier {tier}) includes '
                                    f'{target} (tier {t})')
            if COMPAT.search(code) and not rel.startswith('spi/schema.'):
                context = '\n'.join(lines[max(0, n - 6):n])
                found = COMPAT.search(code).group(0)
                tagged = 'compat(0.1.0)' in context or (found == 'PG_NARGS()' and
                                                        'compat(0.2.0)' in context)
                if not tagged:
                    problems.append(f'{where}:{n}: compat: no compat(0.1.0) tag at {found}')
            if COMPAT_0_2.search(code) and not rel.startswith('spi/schema.'):
                context = '\n'.join(lines[max(0, n - 6):n])
                if 'compat(0.2.0)' not in context:
                    problems.append(f'{where}:{n}: compat: no compat(0.2.0) tag at '
                                    f'{COMPAT_0_2.search(code).group(0)}')
            if 'PG_VERSION_NUM' in code and rel != 'compat.hpp':
                problems.append(f'{where}:{n}: versions: PG_VERSION_NUM outside src/compat.hpp')
            for named in NAMED.findall(comments(line)):
                named = named.rstrip('.')
                candidates = [os.path.join(ROOT, named), os.path.join(SRC, named),
                              os.path.join(os.path.dirname(path), named)]
                if not any(os.path.exists(c) for c in candidates):
                    problems.append(f'{where}:{n}: paths: a comment names {named}, which does '
                                    'not exist')
            for named in BARE.findall(comments(line)):
                if named not in known:
                    problems.append(f'{where}:{n}: paths: a comment names {named}, which is '
                                    'no file of src/')
    for p in problems:
        print(p)
    print(f'source rules: {len(problems)} problem(s) in {len(list(sources()))} files')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
